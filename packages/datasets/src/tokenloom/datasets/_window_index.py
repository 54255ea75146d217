"""WindowIndex: fixed windows of seq_len + 1 tokens over memory-mapped shards, counted and addressed (no torch).

KempnerForge semantics by default: windows do not overlap (stride seq_len + 1),
a shard of n tokens gives ``(n - seq_len - 1) // stride + 1`` samples, the
remainder of each shard is unused, and sample ``i`` is found by binary search
over the cumulative per-shard sample counts. ``cross_shard=True`` treats the
shards as one stream; ``stride=seq_len`` makes every token a label exactly once.
:class:`~tokenloom.datasets.MemoryMappedDataset` turns the windows into samples.
"""

from __future__ import annotations

import bisect
import inspect
import os
from typing import Any

import numpy as np

from tokenloom.datasets._byte_ranges import SampleBytes
from tokenloom.datasets._eos import resolve_eos_id
from tokenloom.datasets._packing_mode import Packing, as_packing
from tokenloom.datasets._state import FingerprintState, data_fingerprint, settings_fingerprint
from tokenloom.datasets._stream import open_data, select_shards
from tokenloom.formats import ConfigError, RemoteOptions, TokenDataset
from tokenloom.formats.io import iter_chunks

__all__ = ["WindowIndex", "check_positive", "overlap_intervals"]


def overlap_intervals(dataset: TokenDataset) -> tuple[np.ndarray, np.ndarray]:
    """Global token ranges ``[begin, end)`` that are overlap prefixes (repeats of the previous entry's end).

    Scans each shard's overlap prefixes in bounded chunks (they may be a memory map of 10^9 entries);
    only the entries that have one are gathered.
    """
    begins: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    token_start = 0
    for shard in dataset.shards:
        prefix = shard.overlap_prefix
        if len(prefix) and not (prefix.strides == (0,) and prefix[0] == 0):  # a constant zero index: nothing
            for start, part in iter_chunks(prefix):
                has = np.flatnonzero(part)
                if len(has):
                    first = token_start + np.asarray(shard.offsets[start + has], dtype=np.int64)
                    begins.append(first)
                    ends.append(first + part[has].astype(np.int64))
        token_start += shard.num_tokens
    if not begins:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(begins), np.concatenate(ends)


def check_positive(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ConfigError(f"{name} is {value!r}, expected an integer >= 1", field=name)
    return int(value)


def _unknown_keywords(owner: str, names: list[str]) -> ConfigError:
    """The ConfigError for keywords ``owner`` does not take, listing its own."""
    accepted = [name for name in inspect.signature(WindowIndex.__init__).parameters if name not in ("self", "unknown")]
    return ConfigError(
        f"{owner} does not take {', '.join(names)}", field=names[0], hint=f"It takes {', '.join(accepted)}"
    )


class WindowIndex(SampleBytes, FingerprintState):
    """The torch-free half of :class:`MemoryMappedDataset`: sizing, addressing and fingerprint of the windows.

    Takes the same arguments; ``len``, :meth:`window_start`, :meth:`window` and :meth:`fingerprint` are the
    dataset's. A plan that only counts samples (``tokenloom validate --curriculum``) builds this, not the dataset.
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
        remote: RemoteOptions | None = None,
        **unknown: Any,
    ) -> None:
        if unknown:
            raise _unknown_keywords(type(self).__name__, sorted(unknown))
        self.seq_len = check_positive(seq_len, "seq_len")
        self.stride = check_positive(stride if stride is not None else seq_len + 1, "stride")
        dataset = open_data(data, remote=remote)
        if file_pattern is not None:
            dataset = select_shards(dataset, pattern=file_pattern)
        self._hold(data, dataset)
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

    # -- addressing -------------------------------------------------------------------
    def __len__(self) -> int:
        return self._length

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

    def overlap_mask(self, begins: np.ndarray, width: int) -> np.ndarray | None:
        """Rows of ``width`` flags: which global positions ``begins[row] + k`` lie in an overlap prefix (None:
        the data has none)."""
        if len(self._overlap_begins) == 0:
            return None
        mask = np.zeros((len(begins), width), dtype=bool)
        lo = np.searchsorted(self._overlap_ends, begins, side="right")
        hi = np.searchsorted(self._overlap_begins, begins + width, side="left")
        for row in np.flatnonzero(hi > lo).tolist():
            base = int(begins[row])
            for j in range(int(lo[row]), int(hi[row])):
                mask[
                    row, max(int(self._overlap_begins[j]) - base, 0) : min(int(self._overlap_ends[j]) - base, width)
                ] = True
        return mask

    def _sample_token_ranges(self, index: int) -> list[tuple[int, int]]:
        begin = self.window_start(index)
        return [(begin, begin + self.seq_len + 1)]

    def _window(self, begin: int) -> np.ndarray:
        end = begin + self.seq_len + 1
        if self.cross_shard:
            return self._stream.tokens(begin, end)
        k = int(np.searchsorted(self._shard_token_starts, begin, side="right")) - 1
        local = begin - int(self._shard_token_starts[k])
        return self._stream.shards[k].tokens[local : local + self.seq_len + 1]
