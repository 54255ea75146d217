"""The demo's eval leg: 2 real gloo processes; rank 0 builds the eval set, both receive it.

The eval set is the val/<bucket> splits of the curriculum leg. The score is a fixed function
every rank computes from the same files: a unigram language model with add-one smoothing
counted on train/<bucket> (loss of a label token = -log p(token)). The check: both ranks
received the same bytes, their shares cover every label token once, and the token-weighted
eval loss (all-reduced) is one number on both ranks and equals the loss of the whole set
computed by one rank alone.
"""

from __future__ import annotations

import datetime
import hashlib
import multiprocessing
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import torch

from tokenloom.formats import ConfigError, open_dataset

__all__ = ["EVAL_WORLD", "EvalReport", "run_eval"]

EVAL_WORLD = 2
SEQ_LEN = 128
TIMEOUT = 60.0  # seconds: any collective, and each process as a whole


@dataclass
class EvalReport:
    rows: int = 0
    tokens: int = 0  # label tokens scored over both ranks
    loss: float = float("nan")
    single_process_loss: float = float("nan")
    same_bytes: bool = False
    same_loss: bool = False
    seconds: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.same_bytes and self.same_loss


def _stream(directories: Sequence[str]) -> tuple[np.ndarray, int, int]:
    datasets = [open_dataset(d) for d in directories]
    tokens = np.concatenate([d.tokens(0, d.num_tokens).astype(np.int64) for d in datasets])
    eos_id, vocab_size = datasets[0].eos_id, datasets[0].vocab_size
    if eos_id is None or vocab_size is None:
        raise ConfigError(
            "the buckets record no EOS id or vocab size",
            path=directories[0],
            hint="Re-tokenize with tokenloom tokenize",
        )
    return tokens, int(eos_id), int(vocab_size)


def unigram_log_probs(train: Sequence[str]) -> np.ndarray:
    """log p(token) of an add-one smoothed unigram model counted on the train buckets."""
    tokens, _, vocab = _stream(train)
    counts = np.bincount(tokens, minlength=vocab).astype(np.float64) + 1.0
    return np.log(counts / counts.sum())


def _score(log_probs: np.ndarray, dataset: Any) -> tuple[float, int]:
    """(sum of -log p over the label tokens, their number); -100 labels are not scored."""
    if len(dataset) == 0:
        return 0.0, 0
    labels = dataset.batch(np.arange(len(dataset)))["labels"].numpy()
    scored = labels[labels != -100]
    return float(-log_probs[scored].sum()), int(scored.size)


def _rank(rank: int, init_file: str, train: list[str], val: list[str], out: str) -> None:
    result: dict[str, Any] = {"rank": rank}
    try:
        torch.set_num_threads(1)
        import torch.distributed as dist

        from tokenloom.eval_broadcast import EvalDataset, EvalTokens, broadcast_eval_set, token_weighted_mean

        dist.init_process_group(
            "gloo",
            init_method=Path(init_file).resolve().as_uri(),  # absolute: a relative --workdir too
            rank=rank,
            world_size=EVAL_WORLD,
            timeout=datetime.timedelta(seconds=TIMEOUT),
        )

        def build() -> EvalTokens:  # runs on rank 0 only
            tokens, eos_id, vocab = _stream(val)
            return EvalTokens(tokens, eos_id=eos_id, vocab_size=vocab)

        evalset = broadcast_eval_set(build, seq_len=SEQ_LEN, timeout=TIMEOUT)
        log_probs = unigram_log_probs(train)  # every rank counts it from the same files
        loss_sum, tokens = _score(log_probs, EvalDataset(evalset.split(rank, EVAL_WORLD), pack_sequences=True))
        mean = token_weighted_mean(torch.tensor(loss_sum, dtype=torch.float64), torch.tensor(tokens))
        whole_sum, whole_tokens = _score(log_probs, EvalDataset(evalset, pack_sequences=True))
        result.update(
            rows=len(evalset),
            digest=hashlib.sha256(evalset.numpy().tobytes()).hexdigest(),
            model=hashlib.sha256(log_probs.tobytes()).hexdigest(),
            tokens=tokens,
            loss=float(mean),
            whole_loss=whole_sum / whole_tokens,
            whole_tokens=whole_tokens,
        )
        dist.destroy_process_group()
    except BaseException as exc:  # reported by the parent
        result["error"] = f"rank {rank}: {type(exc).__name__}: {exc}"
    Path(out, f"eval-rank{rank}.json").write_bytes(orjson.dumps(result))
    os._exit(0)


def run_eval(workdir: Path, data: Path | str, buckets: Sequence[str]) -> EvalReport:
    """``data``: a local directory or a URL (``s3://...``, credentials from the environment)."""
    import time

    report = EvalReport()
    started = time.perf_counter()
    out = workdir / "eval"
    out.mkdir(exist_ok=True)
    init_file = out / "gloo-init"
    init_file.unlink(missing_ok=True)
    for stale in out.glob("eval-rank*.json"):
        stale.unlink()
    root = str(data).rstrip("/")  # a URL stays a URL (Path would fold s3://b into s3:/b)
    train = [f"{root}/train/{b}" for b in buckets]
    val = [f"{root}/val/{b}" for b in buckets]
    # fork: the ranks start in milliseconds from this process (torch already imported); no tokenizer
    # is used in them and each limits torch to one thread
    context = multiprocessing.get_context("fork")
    processes = [
        context.Process(target=_rank, args=(rank, str(init_file), train, val, str(out)), daemon=True)
        for rank in range(EVAL_WORLD)
    ]
    for process in processes:
        process.start()
    deadline = time.monotonic() + 2 * TIMEOUT
    for process in processes:
        process.join(max(0.1, deadline - time.monotonic()))
    hung = [rank for rank, process in enumerate(processes) if process.is_alive()]
    for rank in hung:
        processes[rank].kill()
        processes[rank].join()
    report.seconds = time.perf_counter() - started
    if hung:
        report.error = f"eval ranks {hung} did not finish within {2 * TIMEOUT:.0f} s"
        return report
    results = []
    for rank in range(EVAL_WORLD):
        path = out / f"eval-rank{rank}.json"
        if not path.is_file():
            report.error = f"eval rank {rank} exited with code {processes[rank].exitcode} and no result"
            return report
        results.append(orjson.loads(path.read_bytes()))
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        report.error = "; ".join(errors)
        return report
    first = results[0]
    report.rows = first["rows"]
    report.tokens = sum(r["tokens"] for r in results)
    report.loss = first["loss"]
    report.single_process_loss = first["whole_loss"]
    report.same_bytes = all(r["digest"] == first["digest"] and r["model"] == first["model"] for r in results)
    report.same_loss = (
        all(r["loss"] == first["loss"] for r in results)
        and report.tokens == first["whole_tokens"]
        and abs(first["loss"] - first["whole_loss"]) <= 1e-12 * abs(first["whole_loss"])
    )
    return report
