"""BlockArray: a read-only 1-D token array over a remote object, served from the block cache.

A slice inside one block is a zero-copy view of the block's memory map; a slice across blocks is a
copy of the pieces; ``np.asarray(array)`` reads everything. Only the blocks a slice touches are fetched.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from tokenloom.formats.io.index_map import release_pages
from tokenloom.formats.remote.cache import BlockCache
from tokenloom.formats.remote.client import ObjectInfo

__all__ = ["BlockArray", "read_blocks"]

_TYPED_BLOCKS = 8  # blocks of one array kept as typed views (reads go block after block)


def read_blocks(cache: BlockCache, obj: ObjectInfo, start: int, target: memoryview, *, release: bool = False) -> None:
    """Copy bytes ``[start, start + len(target))`` of ``obj`` into ``target`` from the cache blocks they cover;
    ``release``: then drop each block's pages from this process (a one-off read, such as an index by blocks)."""
    done = 0
    while done < len(target):
        number, inside = divmod(start + done, cache.block_size)
        block = cache.block(obj, number)
        count = min(len(target) - done, len(block) - inside)
        target[done : done + count] = block[inside : inside + count]
        done += count
        if release:
            release_pages(np.frombuffer(block, dtype=np.uint8), 0, len(block))


class BlockArray:
    """``count`` items of ``dtype`` from byte ``byte_offset`` of ``obj``, fetched block by block."""

    def __init__(self, cache: BlockCache, obj: ObjectInfo, dtype: np.dtype, byte_offset: int, count: int) -> None:
        self.cache = cache
        self.obj = obj
        self.dtype = np.dtype(dtype)
        self.byte_offset = byte_offset
        self.count = count
        self._typed: dict[int, np.ndarray] = {}  # block number -> its items (the hot path slices these; the last few)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_typed"] = {}  # views of this process's maps: never pickled (that would copy the data)
        return state

    def _block_items(self, number: int) -> np.ndarray | None:
        """Block ``number`` as whole items, when the block boundaries fall on item boundaries."""
        typed = self._typed.get(number)
        if typed is None:
            item = self.dtype.itemsize
            if self.byte_offset % item or self.cache.block_size % item or self.cache.limit is not None:
                return None  # (a bounded cache unpins old maps: nothing here may keep them alive)
            block = self.cache.block(self.obj, number)
            typed = self._typed[number] = np.frombuffer(block, dtype=self.dtype, count=len(block) // item)
            if len(self._typed) > _TYPED_BLOCKS:  # each keeps its block mapped: see BlockCache.resident_maps
                with contextlib.suppress(KeyError, RuntimeError, StopIteration):  # another thread trimmed it first
                    del self._typed[next(iter(self._typed))]
        return typed

    @property
    def shape(self) -> tuple[int]:
        return (self.count,)

    @property
    def ndim(self) -> int:
        return 1

    @property
    def size(self) -> int:
        return self.count

    def __len__(self) -> int:
        return self.count

    def _read(self, begin: int, end: int) -> np.ndarray:
        item = self.dtype.itemsize
        first_byte = self.byte_offset + begin * item
        last_byte = self.byte_offset + end * item
        size = self.cache.block_size
        first_block, last_block = first_byte // size, (last_byte - 1) // size
        if end <= begin:
            return np.empty(0, dtype=self.dtype)
        if first_block == last_block:
            typed = self._block_items(first_block)
            if typed is not None:
                lo = (first_byte - first_block * size) // item
                return typed[lo : lo + end - begin]
            block = self.cache.block(self.obj, first_block)
            return np.frombuffer(block, dtype=self.dtype, count=end - begin, offset=first_byte - first_block * size)
        found = np.empty(end - begin, dtype=self.dtype)
        read_blocks(self.cache, self.obj, first_byte, found.view(np.uint8).data)
        return found

    def __getitem__(self, index: Any) -> Any:
        if type(index) is slice and index.step is None and (index.start or 0) >= 0 and (index.stop or -1) >= 0:
            begin = index.start or 0
            return self._read(begin, max(begin, min(self.count, index.stop)))
        if isinstance(index, slice) and index.step in (None, 1):
            begin, end, _ = index.indices(self.count)
            return self._read(begin, max(begin, end))
        if isinstance(index, (int, np.integer)):
            position = int(index) + (self.count if index < 0 else 0)
            if not 0 <= position < self.count:
                raise IndexError(f"token {index} out of range for {self.count} tokens")
            return self._read(position, position + 1)[0]
        return np.asarray(self)[index]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self._read(0, self.count)
        return whole.astype(dtype) if dtype is not None else whole

    def __repr__(self) -> str:
        return f"BlockArray({self.obj.url}, {self.count} x {self.dtype.name})"
