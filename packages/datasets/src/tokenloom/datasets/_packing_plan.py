"""The packing plan of whole entries in sequences of seq_len tokens, and PackedIndex, which sizes them (no torch).

Entries are never split, except entries longer than seq_len, which become
seq_len pieces plus a remainder. The plan (which entry goes where) is
computed once, vectorised, and cached in ``plan_cache_dir`` under a key made of the
dataset fingerprint and the settings: written into a fresh temporary directory,
then published by one atomic rename, so concurrent ranks never see half a plan
and need no file locks. :class:`~tokenloom.datasets.PackedDocumentDataset` turns
the plan into samples.
"""

from __future__ import annotations

import io
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from tokenloom.datasets._binpack import PackingAlgorithm, pack_order, plan_bins
from tokenloom.datasets._byte_ranges import SampleBytes
from tokenloom.datasets._packing_mode import check_choice
from tokenloom.datasets._plan_cache import cached_plan
from tokenloom.datasets._state import FingerprintState, data_fingerprint, settings_fingerprint
from tokenloom.datasets._stream import open_data
from tokenloom.datasets._window_index import check_positive
from tokenloom.formats import ConfigError, RemoteOptions, TokenDataset
from tokenloom.formats.io import atomic_write_bytes

__all__ = ["PLAN_VERSION", "PackedIndex", "PackingPlan", "compute_plan"]

log = logging.getLogger("tokenloom.datasets")
PLAN_VERSION = 1
_PLAN_ARRAYS = ("token_start", "length", "prefix", "bin_offsets")


class PackingPlan:
    """Items (token ranges of the global stream) in pack order, and where each sequence's items begin."""

    def __init__(self, token_start: np.ndarray, length: np.ndarray, prefix: np.ndarray, bin_offsets: np.ndarray):
        self.token_start = token_start
        self.length = length
        self.prefix = prefix
        self.bin_offsets = bin_offsets

    @property
    def num_sequences(self) -> int:
        return len(self.bin_offsets) - 1

    def padding_fraction(self, seq_len: int) -> float:
        """Share of the packed tokens that are padding."""
        slots = self.num_sequences * seq_len
        return 0.0 if slots == 0 else 1.0 - float(np.sum(self.length, dtype=np.int64)) / slots

    def save(self, directory: Path) -> None:
        """The arrays, one ``.npy`` each (the cache writes the completion record after them)."""
        for name in _PLAN_ARRAYS:
            buffer = io.BytesIO()
            np.save(buffer, getattr(self, name), allow_pickle=False)
            atomic_write_bytes(directory / f"{name}.npy", buffer.getvalue())

    @classmethod
    def load(cls, directory: Path) -> PackingPlan:
        arrays = [np.load(directory / f"{name}.npy", mmap_mode="r", allow_pickle=False) for name in _PLAN_ARRAYS]
        return cls(*arrays)


def compute_plan(
    doc_lengths: np.ndarray,
    overlap_prefix: np.ndarray,
    seq_len: int,
    algorithm: PackingAlgorithm | str = PackingAlgorithm.BEST_FIT,
    **options: int,
) -> PackingPlan:
    """Split over-long entries, plan the bins, and lay the items out in pack order."""
    lengths = np.asarray(doc_lengths, dtype=np.int64)
    entry_start = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=entry_start[1:])
    pieces = np.maximum(-(-lengths // seq_len), 1)
    entry_of_piece = np.repeat(np.arange(len(lengths)), pieces)
    first_piece = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(pieces, out=first_piece[1:])
    piece_index = np.arange(len(entry_of_piece)) - first_piece[entry_of_piece]
    start = entry_start[entry_of_piece] + piece_index * seq_len
    length = np.minimum(lengths[entry_of_piece] - piece_index * seq_len, seq_len)
    prefix = np.where(piece_index == 0, np.asarray(overlap_prefix, dtype=np.int64)[entry_of_piece], 0)
    bin_of = plan_bins(length, seq_len, algorithm, **options)
    order, bin_offsets = pack_order(bin_of, length)
    return PackingPlan(
        start[order].astype(np.int64),
        length[order].astype(np.int32),
        np.minimum(prefix[order], length[order]).astype(np.uint16),
        bin_offsets,
    )


class PackedIndex(SampleBytes, FingerprintState):
    """The torch-free half of :class:`PackedDocumentDataset`: the packing plan (cached), ``len`` and fingerprint.

    Takes the same arguments; a plan that only counts samples (``tokenloom validate --curriculum``) builds
    this, not the dataset.
    """

    def __init__(
        self,
        data: str | os.PathLike[str] | TokenDataset,
        seq_len: int,
        *,
        pad_id: int | None = None,
        algorithm: PackingAlgorithm | str = PackingAlgorithm.BEST_FIT,
        plan_cache_dir: str | os.PathLike[str] | None = None,
        position_ids: bool = True,
        cu_seqlens: bool = False,
        bin_width: int = 64,
        remote: RemoteOptions | None = None,
    ) -> None:
        self.seq_len = check_positive(seq_len, "seq_len")
        dataset = open_data(data, remote=remote)
        self._hold(data, dataset)
        self.algorithm = check_choice(PackingAlgorithm, algorithm, "algorithm")
        self.pad_id = int(pad_id if pad_id is not None else (dataset.eos_id if dataset.eos_id is not None else 0))
        self.position_ids = position_ids
        self.cu_seqlens = cu_seqlens
        options = {"bin_width": bin_width} if self.algorithm is PackingAlgorithm.GREEDY else {}
        settings = {
            "version": PLAN_VERSION,
            "data": data_fingerprint(dataset),
            "max_length": self.seq_len,  # recorded key: earlier plans stay valid
            "algorithm": self.algorithm.value,
            **options,
        }
        key = settings_fingerprint(**settings)
        directory = (
            Path(plan_cache_dir) if plan_cache_dir is not None else Path.home() / ".cache" / "tokenloom" / "pack-plans"
        )
        self.plan_dir, in_memory = cached_plan(
            directory,
            key,
            lambda: compute_plan(dataset.doc_lengths, dataset.overlap_prefix, self.seq_len, self.algorithm, **options),
            settings,
            _PLAN_ARRAYS,
        )
        self._memory_plan = in_memory  # only when the cache directory could not be written
        self.plan_in_memory = in_memory is not None
        self._plan: PackingPlan | None = in_memory if isinstance(in_memory, PackingPlan) else None
        if self.plan.num_sequences == 0:
            raise ConfigError(
                f"the dataset has no tokens to pack ({len(dataset)} entries, {dataset.num_tokens} tokens)",
                path=dataset.root,
            )
        self.padding_fraction = self.plan.padding_fraction(self.seq_len)
        self._fingerprint = settings_fingerprint(**settings, pad_id=self.pad_id)

    @property
    def plan(self) -> PackingPlan:
        """The packing plan, memory-mapped from the cache (reopened lazily in each worker)."""
        if self._plan is None:
            memory = self._memory_plan
            self._plan = memory if isinstance(memory, PackingPlan) else PackingPlan.load(self.plan_dir)
        return self._plan

    def __getstate__(self) -> dict[str, Any]:
        # pickling a memory map would copy it (an in-memory plan travels as _memory_plan)
        return {**super().__getstate__(), "_plan": None}

    def __len__(self) -> int:
        return self.plan.num_sequences

    def _sample_token_ranges(self, index: int) -> list[tuple[int, int]]:
        plan = self.plan
        first, last = int(plan.bin_offsets[index]), int(plan.bin_offsets[index + 1])
        starts = plan.token_start[first:last].astype(np.int64)
        return list(zip(starts.tolist(), (starts + plan.length[first:last]).tolist(), strict=True))
