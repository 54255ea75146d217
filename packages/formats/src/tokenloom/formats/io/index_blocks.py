"""Index files checked by block on first touch: opening a dataset of 10^9 documents reads none of its index.

The manifest records an xxh3-64 per 1 MiB block of each index file (:mod:`.blockhash`). :class:`IndexBlocks`
keeps such a file as one read-only buffer and :meth:`IndexBlocks.ensure` checks the blocks a byte range
covers the first time this process uses them:

- a local file is memory-mapped (a block's pages are released once hashed: the page cache keeps them);
- a remote object (a :class:`~tokenloom.formats.io.urls.StoredPath`: ``read(start, stop)`` comes from the
  block cache, ``discard()`` drops the cached copy) lands block by block in a sparse unlinked temporary file
  of its size, mapped, so what is never touched costs neither a GET, nor memory, nor disk.

A block that does not match its hash is fetched once more (remote), then a ChecksumError names the file, the
byte range (and, through ``describe``, the documents it holds) and what to do: never wrong data. Without block
hashes (a manifest written before them) the whole file is one block checked by its xxh3-128 at first touch.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import tempfile
from collections.abc import Callable
from typing import Any, Protocol, cast

import xxhash

from tokenloom.formats.errors import ChecksumError
from tokenloom.formats.io.blockhash import BlockHashes
from tokenloom.formats.io.index_map import map_file
from tokenloom.formats.io.urls import StoredPath

__all__ = ["IndexBlocks", "IndexFetch"]

log = logging.getLogger("tokenloom.formats")


class IndexFetch(Protocol):
    """Bytes of a remote index object (a fetched, cached range) and a way to drop its cached copy."""

    def read(self, start: int, stop: int) -> Any: ...

    def discard(self) -> None: ...


class IndexBlocks:
    """The bytes of one index file of ``size`` bytes, each block checked against ``hashes`` on first touch.

    ``where``: the file's path, or a remote object's :class:`StoredPath` (its bytes fetched by blocks; errors name
    its URL); ``checksum``: its xxh3-128, used when ``hashes`` is None.
    """

    def __init__(
        self,
        where: str | StoredPath,
        size: int,
        *,
        hashes: BlockHashes | None = None,
        checksum: str | None = None,
    ) -> None:
        if hashes is None and checksum is None:
            raise ValueError(f"{where}: an index read by blocks needs block hashes or a checksum")
        self.fetch: IndexFetch | None = where if isinstance(where, StoredPath) else None  # type: ignore[assignment]
        self.where, self.size, self.hashes, self.checksum = os.fspath(cast(Any, where)), size, hashes, checksum
        self.block_size = hashes.block_size if hashes is not None else max(size, 1)
        self.checked = bytearray(-(-size // self.block_size))
        self._buffer: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_buffer"] = None  # mapped again, and its blocks checked again, in the receiving process
        state["checked"] = bytearray(len(self.checked))
        return state

    @property
    def buffer(self) -> Any:
        """The whole file as one read-only buffer (bytes not yet :meth:`ensure`-d are unchecked, remote: zeros)."""
        if self._buffer is None:
            if self.fetch is None:
                self._buffer = map_file(self.where) if self.size else b""
            elif self.size:  # an unlinked sparse file, not anonymous memory: dropping its pages keeps its bytes
                with tempfile.TemporaryFile() as handle:
                    handle.truncate(self.size)
                    self._buffer = mmap.mmap(handle.fileno(), self.size)
            else:
                self._buffer = b""
        return self._buffer

    def ensure(self, begin: int, end: int, describe: Callable[[int, int], str] | None = None) -> None:
        """Check every block that bytes ``[begin, end)`` touch and this process has not checked yet.

        ``describe(start, stop)`` names what a bad block's bytes hold (documents), for the error.
        """
        size, checked = self.block_size, self.checked
        for number in range(begin // size, (max(end, begin + 1) - 1) // size + 1):
            if not checked[number]:
                self._check(number, describe)

    def _check(self, number: int, describe: Callable[[int, int], str] | None) -> None:
        start = number * self.block_size
        stop = min(self.size, start + self.block_size)
        buffer = self.buffer
        for attempt in range(2):
            if self.fetch is not None:
                buffer[start:stop] = self.fetch.read(start, stop)
            view = memoryview(buffer)[start:stop]
            try:
                actual, expected = self._digest(view, number)
            finally:
                view.release()
            if actual == expected:
                break
            if self.fetch is None or attempt:
                holds = f" ({describe(start, stop)})" if describe is not None else ""
                raise ChecksumError(
                    f"bytes {start}-{stop} of the index{holds} do not match the manifest: "
                    f"{'xxh3-64' if self.hashes is not None else 'xxh3-128'} {actual}, recorded {expected}",
                    path=self.where,
                    offset=start,
                    field="block_xxh3_64" if self.hashes is not None else "xxh3_128",
                    hint="The index changed or was damaged after the dataset was written: restore it from a good "
                    "copy or re-create the dataset (`tokenloom validate --deep` checks every block)",
                )
            log.warning("%s: bytes %d-%d do not match the manifest: cached copy discarded, fetching again",
                        self.where, start, stop)  # fmt: skip
            self.fetch.discard()  # a corrupt cached copy (or a bad response): fetched again once
        if isinstance(buffer, mmap.mmap):  # hashed: this process need not keep the pages (the file keeps the bytes)
            with contextlib.suppress(OSError, ValueError):
                buffer.madvise(mmap.MADV_DONTNEED, start, stop - start)  # (a block starts on a page)
        self.checked[number] = 1

    def _digest(self, view: memoryview, number: int) -> tuple[str, str]:
        if self.hashes is not None:
            return xxhash.xxh3_64(view).hexdigest(), self.hashes.digest(number)
        return xxhash.xxh3_128(view).hexdigest(), self.checksum or ""
