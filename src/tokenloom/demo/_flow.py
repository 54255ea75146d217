"""The whole tokenloom flow on the built-in corpus, as one function.

stdlib docstrings -> jsonl corpus -> tokenize (2 workers, windowed) -> validate
    -> document-packed windows + bin-packed documents
    -> DataLoader (2 workers) x elastic sampler on 2 simulated ranks -> checkpoint
    -> "restart" on 3 simulated ranks -> finish the epoch -> every sample exactly once
corpus -> modules / classes / functions buckets -> train/<bucket>, val/<bucket>
    -> two-phase curriculum.yaml -> validate --curriculum, curriculum plan --plot
    -> 2 ranks x 2 workers -> checkpoint inside the second phase -> 3 ranks x 1 worker -> the end
    -> schedule oracle (exactly once, the right samples) and realised vs target mix
val/<bucket> -> built on rank 0 of 2 gloo processes, broadcast -> token-weighted eval loss
corpus jsonl -> StreamingHuggingFaceDataset -> stop, resume -> bit-exact
corpus -> conversations (a user asks what `module.name` does, the docstring answers) -> tokenize --train-type sft
    -> every record's mask checked -> packed SFT, 2 ranks x 2 workers -> checkpoint -> 3 ranks -> every record once
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from tokenloom.datasets import MemoryMappedDataset, PackedDocumentDataset
from tokenloom.demo._curriculum import BUCKETS, CurriculumReport, run_curriculum, run_rank
from tokenloom.demo._eval import EvalReport, run_eval
from tokenloom.demo._posttrain import PostTrainReport, run_posttrain
from tokenloom.demo._stream import StreamReport, run_stream
from tokenloom.formats import ResumeMismatchError, TokenDataset, open_dataset
from tokenloom.tokenize import TokenizeConfig, build_stdlib_corpus, tokenize

__all__ = ["DemoReport", "run_demo"]

SEED = 2026
SEQ_LEN = 128
MAX_LENGTH = 1024
OVERLAP = 64
BATCH_SIZE = 4
WORLD_BEFORE, WORLD_AFTER = 2, 3


class WithSampleIds(torch.utils.data.Dataset):
    """Adds each sample's index, so every sample can be accounted for."""

    def __init__(self, dataset: MemoryMappedDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {**self.dataset[index], "sample_id": torch.tensor(index)}


@dataclass
class DemoReport:
    """Figures the demo prints."""

    corpus_documents: int = 0
    corpus_bytes: int = 0
    entries: int = 0
    tokens: int = 0
    shards: int = 0
    tokenize_seconds: float = 0.0
    tokenize_tokens_per_second: float = 0.0
    packing_padding: float = 0.0
    packed_sequences: int = 0
    samples: int = 0
    steps_before: int = 0
    steps_after: int = 0
    samples_per_second: float = 0.0
    consumed_once: bool = False
    duplicates: int = 0
    missing: int = 0
    plot: Path | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    curriculum: CurriculumReport | None = None
    eval: EvalReport | None = None
    stream: StreamReport | None = None
    posttrain: PostTrainReport | None = None
    leg_seconds: dict[str, float] = field(default_factory=dict)

    def failures(self) -> list[str]:
        """Every check that did not pass (empty: the demo passed)."""
        failed = []
        if not self.consumed_once:
            failed.append(f"epoch resume: {self.duplicates} duplicated, {self.missing} missing")
        c = self.curriculum
        if c is None:
            failed.append("curriculum leg did not run")
        else:
            if c.validate_exit != 0:
                failed.append(f"tokenloom validate --curriculum exited {c.validate_exit} (see {c.plan_text})")
            if c.plan_exit != 0:
                failed.append(f"tokenloom curriculum plan exited {c.plan_exit} (see {c.plan_text})")
            if c.validate_exit == 0 and c.plan_exit == 0:
                if not c.exactly_once:
                    failed.append(
                        f"curriculum: {c.duplicates} duplicated, {c.missing} missing, "
                        f"{c.wrong_samples} not the sample the schedule names"
                    )
                if not c.mix_ok:
                    failed.append("curriculum: a realised mix is outside the schedule's bound")
        e = self.eval
        if e is None or not e.ok:
            failed.append(f"eval broadcast: {e.error if e and e.error else 'ranks disagree'}")
        s = self.stream
        if s is None or not s.bit_exact:
            failed.append(
                "streaming resume: "
                + (f"{s.matching} of {s.resumed} resumed batches identical" if s else "did not run")
            )
        failed += ["post-training leg did not run"] if self.posttrain is None else self.posttrain.failures()
        return failed


def run_demo(workdir: Path, *, steps: int = 200, log: Callable[[str], None] = print, plot: bool = True) -> DemoReport:
    """Run the flow in ``workdir`` and return what it measured (raises on any failed check)."""
    report = DemoReport()
    started = time.perf_counter()
    # the parent encodes the small buckets itself; tokenizers' thread pool in a process that
    # later forks DataLoader workers and gloo ranks is what NOTES.md warns about
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    log("1/10 building the corpus from the standard library's docstrings")
    corpus = build_stdlib_corpus(workdir / "corpus")
    report.corpus_documents, report.corpus_bytes = corpus.documents, corpus.num_bytes

    log("2/10 tokenizing with the shipped byte-level BPE on 2 workers (windowed)")
    summary = tokenize(
        TokenizeConfig(
            input_dir=workdir / "corpus",
            output_dir=workdir / "tokens",
            seq_len=MAX_LENGTH,
            overlap_size=OVERLAP,
            num_workers=2,
            shard_size_tokens=1_000_000,
            overwrite=True,
        )
    )
    report.tokenize_seconds = summary.seconds
    report.tokenize_tokens_per_second = summary.tokens_per_second

    log("3/10 validating (deep: checksums, token ids, EOS placement)")
    tokens = open_dataset(workdir / "tokens", validate="deep")
    report.entries, report.tokens, report.shards = len(tokens), tokens.num_tokens, tokens.num_shards

    log("4/10 packing: document-aware windows and best-fit bin packing")
    packed = PackedDocumentDataset(tokens, MAX_LENGTH, plan_cache_dir=workdir / "plans")
    report.packing_padding, report.packed_sequences = packed.padding_fraction, len(packed)
    dataset = WithSampleIds(MemoryMappedDataset(tokens, SEQ_LEN, pack_sequences=True, position_ids=True))
    report.samples = len(dataset)
    if plot:
        report.plot = _plot(tokens, packed, workdir / "tokenloom-demo.png")

    epoch_steps = len(dataset) // (BATCH_SIZE * WORLD_BEFORE)
    if steps > epoch_steps // 2:
        report.notes.append(
            f"--steps {steps} would end the epoch before the checkpoint; checkpointing at step {epoch_steps // 2}"
        )
        steps = max(1, epoch_steps // 2)
    log(f"5/10 training on {WORLD_BEFORE} simulated ranks for {steps} steps, then a checkpoint")
    t0 = time.perf_counter()
    consumed: list[int] = []

    def take(batch: dict[str, torch.Tensor]) -> None:
        consumed.extend(batch["sample_id"].tolist())

    states = []
    for rank in range(WORLD_BEFORE):
        done, state = run_rank(
            dataset, world=WORLD_BEFORE, rank=rank, batch_size=BATCH_SIZE, workers=2, state=None, max_steps=steps,
            on_batch=take, seed=SEED,
        )  # fmt: skip
        states.append(state)
        report.steps_before = max(report.steps_before, done)
    if any(s != states[0] for s in states[1:]):
        raise ResumeMismatchError(f"ranks disagree on the data state: {states}")
    checkpoint = states[0]

    log(f"6/10 restarting on {WORLD_AFTER} simulated ranks from the checkpoint and finishing the epoch")
    for rank in range(WORLD_AFTER):
        done, _ = run_rank(
            dataset, world=WORLD_AFTER, rank=rank, batch_size=BATCH_SIZE, workers=2, state=checkpoint, max_steps=None,
            on_batch=take, seed=SEED,
        )  # fmt: skip
        report.steps_after = max(report.steps_after, done)
    report.samples_per_second = len(consumed) / (time.perf_counter() - t0)

    counts = np.bincount(np.asarray(consumed, dtype=np.int64), minlength=len(dataset))
    report.duplicates = int((counts > 1).sum())
    report.missing = int((counts == 0).sum())
    report.consumed_once = report.duplicates == 0 and report.missing == 0 and len(consumed) == len(dataset)
    report.leg_seconds["corpus, tokenize, pack, epoch resume"] = time.perf_counter() - started

    t0 = time.perf_counter()
    log("7/10 curriculum: module / class / function docstring buckets, two phases, 2x2 -> 3x1 ranks x workers")
    report.curriculum = run_curriculum(workdir, corpus.path, seed=SEED, log=log)
    report.leg_seconds["curriculum"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    log("8/10 eval set built on rank 0 of 2 gloo processes and broadcast; token-weighted eval loss")
    report.eval = run_eval(workdir, workdir / "buckets", BUCKETS)
    report.leg_seconds["eval broadcast"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    log("9/10 streaming the corpus jsonl (StreamingHuggingFaceDataset, 2 workers), stop, resume")
    report.stream = run_stream(workdir, corpus.path, seed=SEED)
    report.leg_seconds["streaming"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    log("10/10 post-training: stdlib conversations -> tokenize --train-type sft -> packed SFT, 2x2 -> 3 ranks")
    report.posttrain = run_posttrain(workdir, corpus.path, seed=SEED, log=log)
    report.leg_seconds["post-training"] = time.perf_counter() - t0
    report.seconds = time.perf_counter() - started
    return report


def _plot(tokens: TokenDataset, packed: PackedDocumentDataset, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    lengths = tokens.doc_lengths
    left.hist(lengths, bins=60, color="#3a6ea5")
    left.set_yscale("log")
    left.set_title(f"entry lengths ({len(lengths):,} entries, windowed at {MAX_LENGTH})")
    left.set_xlabel("tokens")
    left.set_ylabel("entries (log)")
    plan = packed.plan
    used = np.bincount(np.repeat(np.arange(plan.num_sequences), np.diff(plan.bin_offsets)), weights=plan.length)
    right.hist(MAX_LENGTH - used, bins=60, color="#c0504d")
    right.set_title(f"padding per packed sequence (total {packed.padding_fraction:.2%})")
    right.set_xlabel(f"padding tokens of {MAX_LENGTH}")
    right.set_ylabel("sequences")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
