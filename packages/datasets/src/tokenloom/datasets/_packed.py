"""PackedDocumentDataset: whole entries bin-packed into sequences of seq_len tokens.

Entries are never split, except entries longer than seq_len, which become
seq_len pieces plus a remainder (their overlap prefix masks the first
piece). Each sequence is padded with ``pad_id`` (labels -100); labels never
cross from one entry to the next; ``position_ids`` restart at every entry.

The plan (which entry goes where) is computed once, vectorised, and cached in
``plan_cache_dir`` under a key made of the dataset fingerprint and the settings:
written into a fresh temporary directory, then published by one atomic
rename, so concurrent ranks never see half a plan and need no file locks.
The plan and the sizing live in :mod:`._packing_plan` (no torch); this module builds the samples.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from tokenloom.datasets._batch import SampleBatch, batch_tensors
from tokenloom.datasets._packing_plan import PackedIndex, PackingPlan, compute_plan
from tokenloom.datasets._prefetch import Prefetching
from tokenloom.datasets._sample import build_batch, to_torch

__all__ = ["PackedDocumentDataset", "PackingPlan", "compute_plan"]


class PackedDocumentDataset(Prefetching, PackedIndex, Dataset[dict[str, torch.Tensor]]):
    """Sequences of ``seq_len`` tokens made of whole entries, padded; see the README for the keys.

    Args:
        data: a path or URL (``s3://``, ``gs://``, ``az://``, ``https://``) ``open_dataset`` reads, or an open
            :class:`TokenDataset`.
        seq_len: tokens per sequence (L).
        pad_id: the padding token (its labels are -100); default the EOS id, else 0.
        algorithm: "best-fit" (best-fit decreasing) or "greedy" (length-binned greedy).
        plan_cache_dir: a local directory where plans are cached; None: ``~/.cache/tokenloom/pack-plans``.
        position_ids: emit position_ids restarting at each entry (default True).
        cu_seqlens: emit cu_seqlens (padding is one more segment).
        bin_width: the length-bin width of the greedy algorithm.
        remote: for a URL, a ``tokenloom.formats.RemoteOptions`` (endpoint, credentials, block cache; default:
            the environment and ``$TOKENLOOM_CACHE_DIR``).
    """

    def _fill(self, index: int, tokens: np.ndarray, doc_ids: np.ndarray, ignore: np.ndarray) -> None:
        first, last = int(self.plan.bin_offsets[index]), int(self.plan.bin_offsets[index + 1])
        position = 0
        for item in range(first, last):
            start, length = int(self.plan.token_start[item]), int(self.plan.length[item])
            tokens[position : position + length] = self._stream.tokens(start, start + length)
            doc_ids[position : position + length] = item - first
            ignore[position : position + int(self.plan.prefix[item])] = True
            position += length
        tokens[position:] = self.pad_id
        doc_ids[position:] = last - first
        ignore[position:] = True

    def _batch(self, indices: Sequence[int]) -> dict[str, np.ndarray]:
        size = len(self)
        rows = []
        for index in indices:
            if not -size <= index < size:
                raise IndexError(f"sequence {index} out of range for {size} packed sequences")
            rows.append(index % size)
        width = self.seq_len + 1  # one trailing pad so labels line up with input_ids
        tokens = np.empty((len(rows), width), dtype=np.int64)
        doc_ids = np.empty((len(rows), width), dtype=np.int64)
        ignore = np.zeros((len(rows), width), dtype=bool)
        for row, index in enumerate(rows):
            self._fill(index, tokens[row], doc_ids[row], ignore[row])
        return build_batch(
            tokens,
            doc_ids=doc_ids,
            label_ignore=ignore,
            packing="documents",
            position_ids=self.position_ids,
            cu_seqlens=self.cu_seqlens,
        )

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self._prefetch_spec is not None:
            self._prefetch_consumed([index])
        return to_torch({key: value[0] for key, value in self._batch([index]).items()})

    def __getitems__(self, indices: Sequence[int]) -> SampleBatch:
        if self._prefetch_spec is not None:
            self._prefetch_consumed(indices)
        return SampleBatch(batch_tensors(self._batch(indices)))

    def __repr__(self) -> str:
        return (
            f"PackedDocumentDataset(sequences={len(self)}, seq_len={self.seq_len}, "
            f"algorithm={self.algorithm.value!r}, padding={self.padding_fraction:.2%})"
        )
