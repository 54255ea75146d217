"""MemoryMappedDataset: fixed windows of seq_len + 1 tokens over memory-mapped shards.

KempnerForge semantics by default: windows do not overlap (stride seq_len + 1),
a shard of n tokens gives ``(n - seq_len - 1) // stride + 1`` samples, the
remainder of each shard is unused, and sample ``i`` is found by binary search
over the cumulative per-shard sample counts. ``cross_shard=True`` treats the
shards as one stream; ``stride=seq_len`` makes every token a label exactly once.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from tokenloom.datasets._batch import SampleBatch, batch_tensors
from tokenloom.datasets._eos import resolve_eos_id
from tokenloom.datasets._sample import Packing, as_packing, build_batch, to_torch
from tokenloom.datasets._state import check_state, data_fingerprint, settings_fingerprint
from tokenloom.datasets._stream import reopen, select_shards, token_stream
from tokenloom.formats import ConfigError, TokenDataset, open_dataset

__all__ = ["MemoryMappedDataset", "overlap_intervals"]


def overlap_intervals(dataset: TokenDataset) -> tuple[np.ndarray, np.ndarray]:
    """Global token ranges ``[begin, end)`` that are overlap prefixes (repeats of the previous entry's end)."""
    prefix = dataset.overlap_prefix
    has = np.flatnonzero(prefix)
    if len(has) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    entry_starts = np.concatenate([[0], np.cumsum(dataset.doc_lengths)[:-1]]).astype(np.int64)
    begins = entry_starts[has]
    return begins, begins + prefix[has].astype(np.int64)


def check_positive(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ConfigError(f"{name} is {value!r}, expected an integer >= 1", field=name)
    return int(value)


class MemoryMappedDataset(Dataset[dict[str, torch.Tensor]]):
    """Windows of ``seq_len + 1`` tokens as sample dicts (see the package README for every key).

    Args:
        data: a path ``open_dataset`` reads, or an open :class:`TokenDataset`.
        seq_len: tokens per sample (L); each sample reads L + 1 tokens.
        stride: tokens between window starts; default ``seq_len + 1`` (no overlap).
        pack_sequences: False, True (= "documents", KempnerForge) or "gpt-simple".
        eos_id: the EOS id for packing; default the dataset's, then ``tokenizer_path``'s.
        tokenizer_path: a saved Hugging Face tokenizer directory to read the EOS id from.
        file_pattern: keep only shards whose data file name matches this glob.
        cross_shard: windows run across shard boundaries (one stream, one remainder).
        position_ids: emit position_ids reset at each document start (with packing).
        cu_seqlens: emit cu_seqlens (with packing).
    """

    def __init__(
        self,
        data: str | os.PathLike[str] | TokenDataset,
        seq_len: int,
        *,
        stride: int | None = None,
        pack_sequences: bool | str = False,
        eos_id: int | None = None,
        tokenizer_path: str | os.PathLike[str] | None = None,
        file_pattern: str | None = None,
        cross_shard: bool = False,
        position_ids: bool = False,
        cu_seqlens: bool = False,
    ) -> None:
        self.seq_len = check_positive(seq_len, "seq_len")
        self.stride = check_positive(stride if stride is not None else seq_len + 1, "stride")
        dataset = data if isinstance(data, TokenDataset) else open_dataset(data)
        if file_pattern is not None:
            dataset = select_shards(dataset, pattern=file_pattern)
        # reads go through the token stream; the full dataset (its per-entry index grows with
        # the data) is kept only if it was handed in, and never pickled to a worker
        self._dataset: TokenDataset | None = dataset if isinstance(data, TokenDataset) else None
        self._stream = token_stream(dataset)
        self.cross_shard = cross_shard
        self.packing = as_packing(pack_sequences)
        self.eos_id: int | None = None
        if self.packing is not Packing.NONE:
            self.eos_id = resolve_eos_id(eos_id, dataset.eos_id, tokenizer_path, path=dataset.root)
        elif position_ids or cu_seqlens:
            raise ConfigError("position_ids / cu_seqlens need pack_sequences", field="pack_sequences")
        self.position_ids = position_ids
        self.cu_seqlens = cu_seqlens
        window = self.seq_len + 1
        if cross_shard:
            lengths = np.array([dataset.num_tokens], dtype=np.int64)
        else:
            lengths = dataset.shard_num_tokens.astype(np.int64)
        counts = np.where(lengths >= window, (lengths - window) // self.stride + 1, 0)
        if counts.sum() == 0:
            longest = int(np.argmax(dataset.shard_num_tokens))
            where = "all shards together" if cross_shard else f"its longest shard {dataset.shards[longest].name!r}"
            raise ConfigError(
                f"the dataset is shorter than one window: {where} has "
                f"{int(lengths.max())} tokens, a window needs seq_len + 1 = {window}",
                path=dataset.shards[longest].tokens_path,
                field="seq_len",
                hint="Use a smaller seq_len, or cross_shard=True to join shards",
            )
        self.samples_per_shard = counts
        # plain batches are gathered in the storage dtype (uint16, int32, ...) and widened to int64 late
        window_dtype = np.result_type(*[shard.dtype for shard in dataset.shards])
        self._window_dtype = window_dtype if np.can_cast(window_dtype, np.int64, "safe") else np.dtype(np.int64)
        self._sample_starts = [0, *np.cumsum(counts).tolist()]
        self._sample_starts_np = np.asarray(self._sample_starts, dtype=np.int64)
        self._shard_token_starts = np.concatenate([[0], np.cumsum(dataset.shard_num_tokens)]).astype(np.int64)
        self._length = int(self._sample_starts[-1])
        self._overlap_begins, self._overlap_ends = overlap_intervals(dataset)
        self._fingerprint = settings_fingerprint(
            data=data_fingerprint(dataset),
            shards=[s.name for s in dataset.shards],
            seq_len=self.seq_len,
            stride=self.stride,
            packing=self.packing.value,
            eos_id=self.eos_id,
            cross_shard=cross_shard,
        )

    @property
    def dataset(self) -> TokenDataset:
        """The underlying dataset with its entry index (reopened on first use after pickling)."""
        if self._dataset is None:
            self._dataset = reopen(self._stream.root, [s.name for s in self._stream.shards])
        return self._dataset

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_dataset"] = None
        return state

    # -- addressing -------------------------------------------------------------------
    def __len__(self) -> int:
        return self._length

    def fingerprint(self) -> str:
        """Changes whenever the data or a setting that changes the samples changes."""
        return self._fingerprint

    def window_start(self, index: int) -> int:
        """Global token position where sample ``index``'s window begins."""
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError(f"sample {index} out of range for a dataset of {self._length} samples")
        k = bisect.bisect_right(self._sample_starts, index) - 1
        return int(self._shard_token_starts[k]) + (index - self._sample_starts[k]) * self.stride

    @property
    def plain(self) -> bool:
        """Samples are the raw windows (no packing, no overlap masking): :meth:`window` is all there is."""
        return self.packing is Packing.NONE and len(self._overlap_begins) == 0

    @property
    def window_dtype(self) -> np.dtype:
        """The dtype :meth:`window` returns (the shards' storage dtype, widened to a common one)."""
        return self._window_dtype

    def window(self, index: int) -> np.ndarray:
        """The ``seq_len + 1`` raw tokens of sample ``index`` (a zero-copy view where possible)."""
        return self._window(self.window_start(index))

    def _window(self, begin: int) -> np.ndarray:
        end = begin + self.seq_len + 1
        if self.cross_shard:
            return self._stream.tokens(begin, end)
        k = int(np.searchsorted(self._shard_token_starts, begin, side="right")) - 1
        local = begin - int(self._shard_token_starts[k])
        return self._stream.shards[k].tokens[local : local + self.seq_len + 1]

    def _label_ignore(self, begins: np.ndarray) -> np.ndarray | None:
        if len(self._overlap_begins) == 0:
            return None
        width = self.seq_len + 1
        mask = np.zeros((len(begins), width), dtype=bool)
        lo = np.searchsorted(self._overlap_ends, begins, side="right")
        hi = np.searchsorted(self._overlap_begins, begins + width, side="left")
        for row in np.flatnonzero(hi > lo):
            base = int(begins[row])
            for j in range(int(lo[row]), int(hi[row])):
                a = max(int(self._overlap_begins[j]) - base, 0)
                b = min(int(self._overlap_ends[j]) - base, width)
                mask[row, a:b] = True
        return mask

    def _build(self, windows: np.ndarray, begins: np.ndarray) -> dict[str, np.ndarray]:
        return build_batch(
            windows,
            eos_id=self.eos_id,
            packing=self.packing,
            label_ignore=self._label_ignore(begins),
            position_ids=self.position_ids,
            cu_seqlens=self.cu_seqlens,
        )

    # -- fetching -----------------------------------------------------------------------
    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        begin = self.window_start(index)
        window = self._window(begin)
        if self.packing is Packing.NONE and len(self._overlap_begins) == 0:
            tokens = window.astype(np.int64)
            return {"input_ids": torch.from_numpy(tokens[:-1]), "labels": torch.from_numpy(tokens[1:].copy())}
        sample = self._build(window[None, :], np.array([begin], dtype=np.int64))
        return to_torch({key: value[0] for key, value in sample.items()})

    def __getitems__(self, indices: Sequence[int]) -> SampleBatch:
        """A whole batch in one call: one gather, one vectorised sample build."""
        index = np.asarray(indices, dtype=np.int64)
        index = np.where(index < 0, index + self._length, index)
        if len(index) and (index.min() < 0 or index.max() >= self._length):
            raise IndexError(f"sample indices outside [0, {self._length})")
        shard = np.searchsorted(self._sample_starts_np, index, side="right") - 1
        begins = self._shard_token_starts[shard] + (index - self._sample_starts_np[shard]) * self.stride
        if self.packing is Packing.NONE and len(self._overlap_begins) == 0:
            # the hot path: memory map -> one (B, L + 1) array in the storage dtype, one copy per token;
            # widened to int64 where the batch is used (in the main process, when it comes from a worker)
            windows = np.empty((len(index), self.seq_len + 1), dtype=self._window_dtype)
            for row, begin in enumerate(begins.tolist()):
                windows[row] = self._window(begin)
            return SampleBatch.from_windows(windows)
        windows = np.empty((len(index), self.seq_len + 1), dtype=np.int64)
        for row, begin in enumerate(begins.tolist()):
            windows[row] = self._window(begin)
        return SampleBatch(batch_tensors(self._build(windows, begins)))

    # -- resume -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """No position of its own (the sampler holds it); the fingerprint guards a resume."""
        return {"fingerprint": self._fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, fingerprint=self._fingerprint, owner="MemoryMappedDataset")

    def __repr__(self) -> str:
        return (
            f"MemoryMappedDataset(samples={self._length}, seq_len={self.seq_len}, stride={self.stride}, "
            f"packing={self.packing.value!r}, cross_shard={self.cross_shard}, data={str(self._stream.root)!r})"
        )
