"""MemoryMappedDataset: fixed windows of seq_len + 1 tokens over memory-mapped shards.

KempnerForge semantics by default: windows do not overlap (stride seq_len + 1),
a shard of n tokens gives ``(n - seq_len - 1) // stride + 1`` samples, the
remainder of each shard is unused, and sample ``i`` is found by binary search
over the cumulative per-shard sample counts. ``cross_shard=True`` treats the
shards as one stream; ``stride=seq_len`` makes every token a label exactly once.
The counting and addressing live in :mod:`._window_index` (no torch); this module builds the samples.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from tokenloom.datasets._batch import SampleBatch, batch_tensors
from tokenloom.datasets._prefetch import Prefetching
from tokenloom.datasets._sample import build_batch, to_torch
from tokenloom.datasets._window_index import WindowIndex, check_positive, overlap_intervals

__all__ = ["MemoryMappedDataset", "check_positive", "overlap_intervals"]


class MemoryMappedDataset(Prefetching, WindowIndex, Dataset[dict[str, torch.Tensor]]):
    """Windows of ``seq_len + 1`` tokens as sample dicts (see the package README for every key).

    Args:
        data: a path or URL (``s3://``, ``gs://``, ``az://``, ``https://``) ``open_dataset`` reads, or an open
            :class:`TokenDataset`.
        seq_len: tokens per sample (L); each sample reads L + 1 tokens.
        stride: tokens between window starts; default ``seq_len + 1`` (no overlap).
        pack_sequences: False, True (= "documents", KempnerForge) or "gpt-simple".
        eos_id: the EOS id for packing; default the dataset's, then ``tokenizer_path``'s.
        tokenizer_path: a saved Hugging Face tokenizer directory to read the EOS id from.
        file_pattern: keep only shards whose data file name matches this glob.
        cross_shard: windows run across shard boundaries (one stream, one remainder).
        position_ids: emit position_ids reset at each document start (with packing).
        cu_seqlens: emit cu_seqlens (with packing).
        remote: for a URL, a ``tokenloom.formats.RemoteOptions`` (endpoint, credentials, block cache; default:
            the environment and ``$TOKENLOOM_CACHE_DIR``).
    """

    # -- samples ----------------------------------------------------------------------
    def _build(self, windows: np.ndarray, begins: np.ndarray) -> dict[str, np.ndarray]:
        return build_batch(
            windows,
            eos_id=self.eos_id,
            packing=self.packing,
            label_ignore=self.overlap_mask(begins, self.seq_len + 1),
            position_ids=self.position_ids,
            cu_seqlens=self.cu_seqlens,
        )

    # -- fetching -----------------------------------------------------------------------
    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self._prefetch_spec is not None:
            self._prefetch_consumed([index])
        begin = self.window_start(index)
        window = self._window(begin)
        if self.plain:
            tokens = window.astype(np.int64)
            return {"input_ids": torch.from_numpy(tokens[:-1]), "labels": torch.from_numpy(tokens[1:].copy())}
        sample = self._build(window[None, :], np.array([begin], dtype=np.int64))
        return to_torch({key: value[0] for key, value in sample.items()})

    def __getitems__(self, indices: Sequence[int]) -> SampleBatch:
        """A whole batch in one call: one gather, one vectorised sample build."""
        if self._prefetch_spec is not None:
            self._prefetch_consumed(indices)
        index = np.asarray(indices, dtype=np.int64)
        index = np.where(index < 0, index + self._length, index)
        if len(index) and (index.min() < 0 or index.max() >= self._length):
            raise IndexError(f"sample indices outside [0, {self._length})")
        shard = np.searchsorted(self._sample_starts_np, index, side="right") - 1
        begins = self._shard_token_starts[shard] + (index - self._sample_starts_np[shard]) * self.stride
        # the hot path (plain): memory map -> one (B, L + 1) array in the storage dtype, one copy per token;
        # widened to int64 where the batch is used (in the main process, when it comes from a worker)
        windows = np.empty((len(index), self.seq_len + 1), dtype=self._window_dtype if self.plain else np.int64)
        for row, begin in enumerate(begins.tolist()):
            windows[row] = self._window(begin)
        if self.plain:
            return SampleBatch.from_windows(windows)
        return SampleBatch(batch_tensors(self._build(windows, begins)))

    def __repr__(self) -> str:
        return (
            f"MemoryMappedDataset(samples={self._length}, seq_len={self.seq_len}, stride={self.stride}, "
            f"packing={self.packing.value!r}, cross_shard={self.cross_shard}, data={str(self._stream.root)!r})"
        )
