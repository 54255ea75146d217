"""Where a reader's bytes come from: the one place where a dataset path becomes bytes or a token array.

Readers work on paths (stat, glob, small index files read whole) and ask the *current source* for the
bytes of data files: :meth:`Source.open` (headers, an HDF5 file, checksums) and :meth:`Source.tokens`
(a shard's token array). The default, :data:`LOCAL`, opens the file and memory-maps it, as readers always
did. ``tokenloom.formats.remote`` opens a URL by running the same reader on a :class:`StoredPath` (its
``RemotePath``: the listing answers stat and glob, the block cache gives the bytes) inside
``using_source(remote)``. A :class:`~tokenloom.formats._dataset.Shard` keeps the source it was created under
(it is pickled with it), so a DataLoader worker reads the same way.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import numpy as np

from tokenloom.formats.io.storage import storage_errors
from tokenloom.formats.io.urls import StoredPath

__all__ = [
    "LOCAL",
    "LocalSource",
    "Source",
    "add_data_suffixes",
    "before_data_suffixes",
    "current_source",
    "data_suffixes",
    "map_tokens",
    "using_source",
]

#: objects read by blocks from object storage; every other object is fetched whole. Each format's
#: spec names its own (``FormatSpec.suffixes``); ``register_format`` adds them here.
_data_suffixes: tuple[str, ...] = ()
_before_first_answer: list[Callable[[], None]] = []
#: held while the hooks run (and while a format adds its suffixes): another thread waits for the whole list
_suffixes_lock = threading.RLock()


def add_data_suffixes(suffixes: tuple[str, ...]) -> None:
    """Count ``suffixes`` as data-file suffixes (called by ``register_format`` with a format's own)."""
    global _data_suffixes
    with _suffixes_lock:
        _data_suffixes = tuple(sorted({*_data_suffixes, *suffixes}))


def before_data_suffixes(hook: Callable[[], None]) -> None:
    """Run ``hook`` once, before :func:`data_suffixes` first answers (the registry's: it registers every built-in
    format, which otherwise registers only when first asked for)."""
    _before_first_answer.append(hook)


def data_suffixes() -> tuple[str, ...]:
    """The suffixes of every registered format's data files (read by blocks from object storage)."""
    with _suffixes_lock:
        while _before_first_answer:
            _before_first_answer.pop()()
        return _data_suffixes


class Source(Protocol):
    """Data-file bytes for readers: a read-only file object and a 1-D token array."""

    def open(self, path: str | os.PathLike[str]) -> BinaryIO: ...

    def tokens(self, path: str | os.PathLike[str], dtype: np.dtype, byte_offset: int, count: int) -> Any: ...


class LocalSource:
    """Files on a local (or mounted) filesystem: ``open`` and a memory map (a :class:`StoredPath` serves its own)."""

    def open(self, path: str | os.PathLike[str]) -> BinaryIO:
        return path.open() if isinstance(path, StoredPath) else open(path, "rb")

    def tokens(self, path: str | os.PathLike[str], dtype: np.dtype, byte_offset: int, count: int) -> Any:
        if isinstance(path, StoredPath):
            return path.array(dtype, byte_offset, count)
        return map_tokens(Path(path), dtype, byte_offset, count)

    def __reduce__(self) -> str:
        return "LOCAL"  # one instance per process, also after unpickling


LOCAL = LocalSource()


_CURRENT: ContextVar[Source] = ContextVar("tokenloom_source", default=LOCAL)


def current_source() -> Source:
    """The source of the reader running now (:data:`LOCAL` unless inside :func:`using_source`)."""
    return _CURRENT.get()


@contextlib.contextmanager
def using_source(source: Source) -> Iterator[None]:
    """Run the readers inside the block against ``source``."""
    token = _CURRENT.set(source)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def map_tokens(path: Path, dtype: np.dtype, byte_offset: int, count: int) -> np.ndarray:
    """A read-only zero-copy array of ``count`` tokens of ``dtype`` at ``byte_offset`` in ``path``."""
    if count == 0:
        return np.empty(0, dtype=dtype)
    with storage_errors(path, "mapping tokens"), open(path, "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    # A plain ndarray over the mmap slices faster than np.memmap (no subclass overhead).
    return np.frombuffer(mapped, dtype=dtype, count=count, offset=byte_offset)
