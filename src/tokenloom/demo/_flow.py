"""The whole tokenloom flow on the built-in corpus, as one function.

stdlib docstrings -> jsonl corpus -> tokenize (2 workers, windowed) -> validate
    -> document-packed windows + bin-packed documents
    -> DataLoader (2 workers) x elastic sampler on 2 simulated ranks -> checkpoint
    -> "restart" on 3 simulated ranks -> finish the epoch -> every sample exactly once
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from tokenloom.datasets import MemoryMappedDataset, PackedDocumentDataset
from tokenloom.formats import ResumeMismatchError, TokenDataset, open_dataset
from tokenloom.sampler import ResumableDistributedSampler, sampler_state_from_loader
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


def _run_rank(
    dataset: WithSampleIds,
    *,
    world: int,
    rank: int,
    state: dict[str, Any] | None,
    max_steps: int | None,
) -> tuple[list[int], int, dict[str, Any]]:
    sampler = ResumableDistributedSampler(dataset, num_replicas=world, rank=rank, seed=SEED, pad=False)
    if state is not None:
        sampler.load_state_dict(state)
    with warnings.catch_warnings():  # torchdata 0.11 calls a deprecated torch API on every loader
        warnings.filterwarnings("ignore", message=".*set_vital.*")
        loader = StatefulDataLoader(dataset, sampler=sampler, batch_size=BATCH_SIZE, num_workers=2)
        iterator = iter(loader)
    ids: list[int] = []
    steps = 0
    for batch in iterator:
        ids.extend(batch["sample_id"].tolist())
        steps += 1
        if max_steps is not None and steps == max_steps:
            break
    return ids, steps, sampler_state_from_loader(loader.state_dict())


def run_demo(workdir: Path, *, steps: int = 200, log: Callable[[str], None] = print, plot: bool = True) -> DemoReport:
    """Run the flow in ``workdir`` and return what it measured (raises on any failed check)."""
    report = DemoReport()
    started = time.perf_counter()

    log("1/6 building the corpus from the standard library's docstrings")
    corpus = build_stdlib_corpus(workdir / "corpus")
    report.corpus_documents, report.corpus_bytes = corpus.documents, corpus.num_bytes

    log("2/6 tokenizing with the shipped byte-level BPE on 2 workers (windowed)")
    summary = tokenize(
        TokenizeConfig(
            input_dir=workdir / "corpus",
            output_dir=workdir / "tokens",
            max_length=MAX_LENGTH,
            overlap_size=OVERLAP,
            num_workers=2,
            shard_size_tokens=1_000_000,
            overwrite=True,
        )
    )
    report.tokenize_seconds = summary.seconds
    report.tokenize_tokens_per_second = summary.tokens_per_second

    log("3/6 validating (deep: checksums, token ids, EOS placement)")
    tokens = open_dataset(workdir / "tokens", validate="deep")
    report.entries, report.tokens, report.shards = len(tokens), tokens.num_tokens, tokens.num_shards

    log("4/6 packing: document-aware windows and best-fit bin packing")
    packed = PackedDocumentDataset(tokens, MAX_LENGTH, cache_dir=workdir / "plans")
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
    log(f"5/6 training on {WORLD_BEFORE} simulated ranks for {steps} steps, then a checkpoint")
    t0 = time.perf_counter()
    consumed: list[int] = []
    states = []
    for rank in range(WORLD_BEFORE):
        ids, done, state = _run_rank(dataset, world=WORLD_BEFORE, rank=rank, state=None, max_steps=steps)
        consumed += ids
        states.append(state)
        report.steps_before = max(report.steps_before, done)
    if any(s != states[0] for s in states[1:]):
        raise ResumeMismatchError(f"ranks disagree on the data state: {states}")
    checkpoint = states[0]

    log(f"6/6 restarting on {WORLD_AFTER} simulated ranks from the checkpoint and finishing the epoch")
    for rank in range(WORLD_AFTER):
        ids, done, _ = _run_rank(dataset, world=WORLD_AFTER, rank=rank, state=checkpoint, max_steps=None)
        consumed += ids
        report.steps_after = max(report.steps_after, done)
    report.samples_per_second = len(consumed) / (time.perf_counter() - t0)

    counts = np.bincount(np.asarray(consumed, dtype=np.int64), minlength=len(dataset))
    report.duplicates = int((counts > 1).sum())
    report.missing = int((counts == 0).sum())
    report.consumed_once = report.duplicates == 0 and report.missing == 0 and len(consumed) == len(dataset)
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
