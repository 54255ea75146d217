"""The demo's streaming leg: the corpus jsonl through StreamingHuggingFaceDataset, stopped and resumed.

One run streams BATCHES batches and saves the loader's state after STOP_AT of them; a fresh
dataset and loader (new worker processes, the tokenizer loaded again in them) load that state
and stream on. Bit-exact means the resumed batches are byte-identical to the uninterrupted ones.
"""

from __future__ import annotations

import hashlib
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from tokenloom.hf_streaming import StreamingHuggingFaceDataset, load_rank_states, save_rank_state
from tokenloom.tokenize import default_tokenizer_path

__all__ = ["StreamReport", "run_stream"]

SEQ_LEN = 128
BATCH = 8
WORKERS = 2
BATCHES, STOP_AT = 48, 20
UNIT_BYTES = 256 << 10  # the 1.3 MB corpus as a handful of byte ranges, dealt to the 2 workers


@dataclass
class StreamReport:
    batches: int = 0
    resumed: int = 0
    matching: int = 0
    tokens: int = 0
    seconds: float = 0.0
    state: Path | None = None

    @property
    def bit_exact(self) -> bool:
        return self.resumed == BATCHES - STOP_AT and self.matching == self.resumed


def _digest(batch: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for key in sorted(batch):
        h.update(key.encode())
        h.update(batch[key].numpy().tobytes())
    return h.hexdigest()


def _loader(corpus: Path, seed: int) -> StatefulDataLoader:
    dataset = StreamingHuggingFaceDataset(
        "json",
        "train",
        "text",
        seq_len=SEQ_LEN,
        tokenizer_path=default_tokenizer_path(),
        data_files=[str(corpus)],
        rank=0,
        world_size=1,
        seed=seed,
        pack_sequences=True,
        with_provenance=True,
        unit_bytes=UNIT_BYTES,
    )
    with warnings.catch_warnings():  # torchdata 0.11 calls a deprecated torch API on every loader
        warnings.filterwarnings("ignore", message=".*set_vital.*")
        return StatefulDataLoader(dataset, batch_size=BATCH, num_workers=WORKERS, timeout=120)


def run_stream(workdir: Path, corpus: Path, *, seed: int) -> StreamReport:
    report = StreamReport()
    started = time.perf_counter()
    reference: list[str] = []
    state: dict[str, Any] | None = None
    loader = _loader(corpus, seed)
    for batch in loader:
        reference.append(_digest(batch))
        report.tokens += int((batch["labels"] != -100).sum())
        if len(reference) == STOP_AT:
            state = loader.state_dict()
        if len(reference) == BATCHES:
            break
    del loader
    report.batches = len(reference)
    if state is None or report.batches < BATCHES:
        return report  # too short a stream: the check fails with resumed = 0
    report.state = save_rank_state(workdir / "stream-state", 0, state)  # crash-safe JSON, one file per rank
    resumed = _loader(corpus, seed)  # a new process's view: a fresh dataset and loader
    resumed.load_state_dict(load_rank_states(workdir / "stream-state", 1)[0])
    for batch, expected in zip(resumed, reference[STOP_AT:], strict=False):
        report.resumed += 1
        report.matching += _digest(batch) == expected
    report.seconds = time.perf_counter() - started
    return report
