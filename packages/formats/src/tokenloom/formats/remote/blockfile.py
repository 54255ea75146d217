"""BlockFile: a read-only, seekable file object over a remote object, served from the block cache.

What a reader opens where it needs a file rather than an array: a ``.npy`` or ``.pbin`` header, the
pickled index at the end of a ``.pbin``, an HDF5 file (h5py reads a Python file object), a checksum
over every byte. Each read touches only the blocks it covers (fetched once per node, then memory-mapped).
"""

from __future__ import annotations

import io
import os

from tokenloom.formats.remote.array import read_blocks
from tokenloom.formats.remote.cache import BlockCache
from tokenloom.formats.remote.client import ObjectInfo

__all__ = ["BlockFile", "ObjectFile"]


class ObjectFile(io.RawIOBase):
    """A read-only, seekable binary file of ``size`` bytes called ``name`` (``seek``, ``tell``); a subclass
    reads from ``position`` in ``readinto``. Any reader of a remote object as a file object can build on it."""

    def __init__(self, name: str, size: int) -> None:
        super().__init__()
        self.name = name
        self.size = size
        self.position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.position, os.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise OSError(f"negative seek position {base + offset} in {self.name}")
        self.position = base + offset
        return self.position


class BlockFile(ObjectFile):
    """The bytes of ``obj`` as a read-only binary file, read from the block cache."""

    def __init__(self, cache: BlockCache, obj: ObjectInfo) -> None:
        super().__init__(obj.url, obj.size)
        self.cache = cache
        self.obj = obj

    def readinto(self, buffer: memoryview | bytearray) -> int:  # pyright: ignore[reportIncompatibleMethodOverride]
        count = max(0, min(len(buffer), self.size - self.position))
        read_blocks(self.cache, self.obj, self.position, memoryview(buffer).cast("B")[:count])
        self.position += count
        return count
