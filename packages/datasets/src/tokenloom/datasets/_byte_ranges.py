"""Which bytes of which data object a sample reads (no torch): the map prefetching and eviction plan with.

A sample is one or more token ranges of the global token stream (a window; a packed sequence's items);
each range lies in one or more shards, and a shard's tokens are one run of bytes in one data object
(a local ``.bin`` or a remote object). :meth:`SampleBytes.byte_ranges` gives ``(shard, start, end)``
byte ranges in the shard's data object, :meth:`SampleBytes.data_object` names that object.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenloom.datasets._stream import reopen, token_stream
from tokenloom.formats import TokenDataset
from tokenloom.formats.io.source import LOCAL

__all__ = ["SampleBytes", "block_array", "token_byte_ranges"]


def block_array(shard: object) -> Any:
    """The remote token array behind ``shard`` (a BlockArray: ``.cache``, ``.obj``, ``.byte_offset``); None on disk.

    A remote shard of any format reads through its remote ``source`` (which holds its block cache).
    """
    if getattr(shard, "source", LOCAL) is LOCAL:
        return None
    tokens = getattr(shard, "tokens", None)
    return tokens if hasattr(tokens, "obj") and hasattr(tokens, "cache") else None


def _byte_offset(shard: object) -> int:
    array = block_array(shard)  # a remote shard: its tokens start at the array's byte offset
    return int(array.byte_offset) if array is not None else int(getattr(shard, "tokens_offset", 0))


def token_byte_ranges(
    stream: TokenDataset, token_starts: np.ndarray, begin: int, end: int
) -> list[tuple[int, int, int]]:
    """``(shard, first byte, end byte)`` in the shards' data objects for tokens ``[begin, end)`` of the stream."""
    ranges = []
    k = int(np.searchsorted(token_starts, begin, side="right")) - 1
    while begin < end:
        shard = stream.shards[k]
        take_end = min(end, int(token_starts[k + 1]))
        if take_end > begin:
            item = shard.dtype.itemsize
            base = _byte_offset(shard)
            local = begin - int(token_starts[k])
            ranges.append((k, base + local * item, base + (local + take_end - begin) * item))
        begin = take_end
        k += 1
    return ranges


class SampleBytes:
    """Mixin for datasets over a token stream: sample index -> the byte ranges it reads."""

    _stream: TokenDataset
    _dataset: TokenDataset | None
    _stream_token_starts: np.ndarray | None = None

    def _hold(self, data: object, dataset: TokenDataset) -> None:
        """Read through the token stream; keep the full dataset (its per-entry index grows with the data) only
        where it was handed in (``data``), and never pickle it to a worker."""
        self._dataset = dataset if isinstance(data, TokenDataset) else None
        self._stream = token_stream(dataset)

    @property
    def dataset(self) -> TokenDataset:
        """The underlying dataset with its entry index (reopened on first use after pickling, with the
        stream's own ``RemoteOptions`` for a URL)."""
        if self._dataset is None:
            self._dataset = reopen(self._stream.root, [s.name for s in self._stream.shards], self._stream.remote)
        return self._dataset

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_dataset": None}

    def _sample_token_ranges(self, index: int) -> list[tuple[int, int]]:
        raise NotImplementedError

    def byte_ranges(self, index: int) -> list[tuple[int, int, int]]:
        """``(shard, start, end)``: the bytes sample ``index`` reads, in shard ``shard``'s :meth:`data_object`."""
        starts = self._stream_token_starts
        if starts is None:
            counts = np.asarray([s.num_tokens for s in self._stream.shards], dtype=np.int64)
            starts = self._stream_token_starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        ranges = []
        for begin, end in self._sample_token_ranges(index):
            ranges += token_byte_ranges(self._stream, starts, begin, end)
        return ranges

    def data_object(self, shard: int) -> str:
        """The URL (remote) or path (local) of shard ``shard``'s data object."""
        stream_shard = self._stream.shards[shard]
        array = block_array(stream_shard)
        return array.obj.url if array is not None else str(stream_shard.tokens_path)
