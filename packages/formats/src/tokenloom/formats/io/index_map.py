"""Index arrays on disk at O(1) memory: mapped lazily, scanned in bounded chunks, derived once into a cache.

A dataset of 10^9 documents has gigabytes of index (offsets, sizes, pointers). Opening one must
not read it into RAM:

- ``map_array`` gives a read-only zero-copy view over a memory map; pages are read on first touch.
- ``iter_chunks`` walks such a view in bounded copies and drops each chunk's pages from the
  process (``MADV_DONTNEED``: the kernel's page cache keeps them, this process's RSS does not),
  so a check that must touch every entry costs one chunk of memory, not the file.
- ``derived_index`` is for indices a format does not store in the form readers need (Megatron's
  byte pointers, a flat dataset's document lengths, a ``.pbin``'s pickled pairs): the int64
  offsets are computed once, streamed into ``CACHE/index-v1/KEY.i64`` (temp file + rename) and
  mapped on every later open. KEY hashes what it was derived from (resolved path, device, inode,
  size, mtime and ctime of every source file), so an edited source gives a new key and a new,
  re-checked derivation: the cache is a pure function of its sources and losing it costs time,
  never data. ``validate="deep"`` always derives again.
- ``remember_checked`` / ``checked_before`` do the same for a check that yields nothing (a native
  index's offsets, an index file's manifest checksum): an empty ``KEY.ok`` file says it passed on
  exactly these versions of the files, so fast validation does not stream 10 GB again at each open.

The cache directory is ``$TOKENLOOM_CACHE_DIR/index-v1``, else ``$XDG_CACHE_HOME/tokenloom/index-v1``,
else ``~/.cache/tokenloom/index-v1``. Where it cannot be written, the derivation goes to an unlinked
temporary file (still memory-mapped, logged once); only where that fails too does it stay in RAM.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import mmap
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from tokenloom.formats.io.storage import storage_error
from tokenloom.formats.io.urls import StoredPath

__all__ = [
    "INDEX_CACHE_ENV",
    "MappedArray",
    "SCAN_CHUNK_ENTRIES",
    "cached_index",
    "checked_before",
    "derived_index",
    "index_cache_dir",
    "iter_chunks",
    "map_array",
    "remember_checked",
    "zeros_index",
]

log = logging.getLogger("tokenloom.formats")

StrPath = str | os.PathLike[str]

INDEX_CACHE_ENV = "TOKENLOOM_CACHE_DIR"
SCAN_CHUNK_ENTRIES = 1 << 18  # 2 MiB of int64 per chunk: a scan's temporaries stay near 10 MB
_CACHE_VERSION = "index-v1"
_PAGE = mmap.PAGESIZE
_FAULT_AROUND = 1 << 20
#: a source modified less than this long ago is derived but not cached (timestamps are coarse)
_SETTLE_NS = 2_000_000_000


class MappedArray(np.ndarray):
    """A read-only array over a memory map that pickles as where it lives, not as its bytes.

    A DataLoader worker started by spawn gets the path and re-maps it; slices pickle as plain copies.
    """

    _source: tuple[str, str, int, int] | None = None

    def __reduce_ex__(self, protocol: Any) -> Any:
        source = self._source
        if source is not None and self.shape == (source[3],):
            return (map_array, source)
        return np.asarray(self).__reduce_ex__(protocol)

    def __reduce__(self) -> Any:
        return self.__reduce_ex__(2)


def map_array(path: str | os.PathLike[str], dtype: np.dtype | str, byte_offset: int, count: int) -> np.ndarray:
    """A read-only zero-copy array of ``count`` items of ``dtype`` at ``byte_offset`` in ``path``.

    Pages are read on first touch; pickling sends the location (see :class:`MappedArray`).
    """
    if count == 0:
        return np.empty(0, dtype=np.dtype(dtype))
    if isinstance(path, StoredPath):
        return path.array(dtype, byte_offset, count)
    return array_in(map_file(path), path, dtype, byte_offset, count)


def map_file(path: str | os.PathLike[str]) -> mmap.mmap | None:
    """A read-only map of the whole file at ``path`` (None if it is empty), for :func:`array_in`."""
    # os.open, not open(): no file object (opening 1,000 native shards maps 1,000 of these)
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except ValueError:  # with length 0, mmap refuses only an empty file
            return None
        finally:
            os.close(fd)
    except OSError as exc:
        named = exc
        if os.path.isdir(path):  # os.open opens a directory (mmap then says ENODEV); open() named it
            named = IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
        raise storage_error(named, path, "mapping an index") from exc


def array_in(
    mapped: mmap.mmap | None, path: str | os.PathLike[str], dtype: np.dtype | str, byte_offset: int, count: int
) -> np.ndarray:
    """The :func:`map_array` array of ``count`` items at ``byte_offset`` over ``mapped`` (:func:`map_file` of
    ``path``): several arrays of one file share one open and one map."""
    dtype = np.dtype(dtype)
    if count == 0:
        return np.empty(0, dtype=dtype)
    if mapped is None:
        raise ValueError(f"{os.fspath(path)} is empty: no {count} items to map")
    array = np.frombuffer(mapped, dtype=dtype, count=count, offset=byte_offset).view(MappedArray)
    array._source = (os.fspath(path), dtype.str, byte_offset, count)
    return array


class _Zeros(np.ndarray):
    def __reduce_ex__(self, protocol: Any) -> Any:
        if self.strides == (0,):
            return (zeros_index, (len(self), self.dtype.str))
        return np.asarray(self).__reduce_ex__(protocol)

    def __reduce__(self) -> Any:
        return self.__reduce_ex__(2)


def zeros_index(count: int, dtype: np.dtype | str = "<u2") -> np.ndarray:
    """``count`` read-only zeros in O(1) memory (one item, stride 0), pickled as their count."""
    return np.broadcast_to(np.zeros(1, dtype=dtype), (count,)).view(_Zeros)


def _backing_map(array: np.ndarray) -> mmap.mmap | None:
    base: object = array
    while base is not None:
        if isinstance(base, mmap.mmap):
            return base
        if isinstance(base, memoryview):
            base = base.obj
        else:
            base = getattr(base, "base", None) if isinstance(base, np.ndarray) else getattr(base, "_mmap", None)
    return None


def release_pages(array: np.ndarray, begin: int, end: int) -> None:
    """Drop the pages of ``array[begin:end]`` from this process if it lies in a memory map (else nothing)."""
    if end <= begin:
        return
    mapped = _backing_map(array)
    if mapped is None:
        return
    source = array._source if isinstance(array, MappedArray) else None
    if source is not None and array.shape == (source[3],):
        first = source[2] + begin * array.itemsize  # a whole array_in array: at its byte offset in the map
    elif array.flags.c_contiguous:
        start = np.frombuffer(mapped, dtype=np.uint8, count=1).__array_interface__["data"][0]
        first = array[begin:end].__array_interface__["data"][0] - start
    else:
        return
    last = first + (end - begin) * array.itemsize
    # widened on both sides: the kernel's fault-around maps neighbouring pages (64 KiB by default) that
    # this range's reads did not ask for, before and after it; they are in the page cache, cheap to refault
    first = max(0, first - first % _PAGE - _FAULT_AROUND)
    last = min(len(mapped), last + (-last) % _PAGE + _FAULT_AROUND)
    if last > first:
        with contextlib.suppress(OSError, ValueError):
            mapped.madvise(mmap.MADV_DONTNEED, first, last - first)


def iter_chunks(array: np.ndarray, chunk: int = SCAN_CHUNK_ENTRIES) -> Iterator[tuple[int, np.ndarray]]:
    """``(start, copy of array[start:start + chunk])`` over the whole array, releasing mapped pages as it goes."""
    for start in range(0, len(array), chunk):
        stop = min(len(array), start + chunk)
        part = np.array(array[start:stop])
        release_pages(array, start, stop)
        yield start, part


def index_cache_dir() -> Path:
    """Where derived indices live (see the module docstring)."""
    return _cache_dir(os.environ.get(INDEX_CACHE_ENV), os.environ.get("XDG_CACHE_HOME"), os.environ.get("HOME"))


@functools.lru_cache(maxsize=8)
def _cache_dir(explicit: str | None, xdg: str | None, home: str | None) -> Path:
    """(Opening 1,000 shards asks twice per shard: the environment is read each time, the path built once.)"""
    if explicit:
        return Path(explicit) / _CACHE_VERSION
    base = xdg or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tokenloom" / _CACHE_VERSION


def _directory(sources: Sequence[StrPath]) -> Path:
    """Where derivations of ``sources`` go: an object store's in its block cache (one cache location per dataset)."""
    stored = [source for source in sources if isinstance(source, StoredPath)]
    return stored[0].index_dir if stored else index_cache_dir()


def _stat(source: StrPath) -> os.stat_result:
    return source.stat() if isinstance(source, StoredPath) else os.stat(source)  # pyright: ignore


def _key(sources: Sequence[StrPath], what: str, infos: Sequence[os.stat_result] | None = None) -> str:
    """The sources' versions (device, inode, size, mtime, ctime: a file, whatever path or link names it) and
    ``what``. Not the resolved path: resolving cost a stat per path component of every shard (a third of
    opening 1,000 local shards). ``infos``: the sources' stats (symlinks followed), when the caller has them."""
    digest = xxhash.xxh3_128(f"{_CACHE_VERSION}\0{what}\0".encode("utf-8", "surrogateescape"))
    versions = "".join(  # one line per source, hashed in one call (a dataset-wide key covers 2,000 files)
        f"{info.st_dev}\0{info.st_ino}\0{info.st_size}\0{info.st_mtime_ns}\0{info.st_ctime_ns}\n"
        for info in (infos if infos is not None else [_stat(source) for source in sources])
    )
    digest.update(versions.encode())
    return digest.hexdigest()


def checked_before(sources: Sequence[StrPath], what: str, infos: Sequence[os.stat_result] | None = None) -> bool:
    """Whether :func:`remember_checked` recorded ``what`` for these versions of ``sources``.

    ``infos``: the sources' current stats (symlinks followed), if the caller just took them (one stat fewer each).
    """
    try:
        return os.path.isfile(os.path.join(_directory(sources), f"{_key(sources, what, infos)}.ok"))
    except OSError:
        return False


def remember_checked(sources: Sequence[StrPath], what: str, infos: Sequence[os.stat_result] | None = None) -> None:
    """Record that the check ``what`` passed on these versions of ``sources`` (nothing if they are too recent).

    ``infos``: the sources' stats taken *before* the check read them (symlinks followed). Recording those
    versions, not stats taken after the check, never marks a version checked that the check did not read
    (a file replaced meanwhile is another version).
    """
    if infos is None:
        infos = [_stat(source) for source in sources]
    if _recent(infos):
        return
    directory = _directory(sources)
    final = os.path.join(directory, f"{_key(sources, what, infos)}.ok")
    # an empty marker is whole as soon as it exists: created in one step, no temp file and rename (a first
    # open of 1,000 native shards records 2,000 checks); O_EXCL neither follows a link nor opens a FIFO
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        try:
            os.close(os.open(final, flags, 0o600))
        except FileNotFoundError:  # no cache directory yet
            directory.mkdir(parents=True, exist_ok=True)
            os.close(os.open(final, flags, 0o600))
    except OSError as exc:
        if isinstance(exc, FileExistsError) and exc.filename == final:
            return  # recorded already (by another process, or a deep check that read the files again)
        # (mkdir's FileExistsError is no record: a file or a dangling link stands where the directory goes)
        log.debug("index cache %s is not writable (%s): %s is checked again next time", directory, exc, what)


def _recent(infos: Iterable[os.stat_result]) -> bool:
    now = time.time_ns()
    return any(now - max(info.st_mtime_ns, info.st_ctime_ns) < _SETTLE_NS for info in infos)


def cached_index(
    sources: Sequence[StrPath], what: str, count: int | None = None, infos: Sequence[os.stat_result] | None = None
) -> np.ndarray | None:
    """What :func:`derived_index` published for these versions of ``sources`` and ``what``, or None.

    ``infos``: the sources' current stats, if the caller just took them (one stat fewer each).
    """
    final = _directory(sources) / f"{_key(sources, what, infos)}.i64"
    try:
        size = final.stat().st_size
    except OSError:
        return None
    if size % 8 or (count is not None and size != 8 * count) or not final.is_file():
        return None
    return map_array(final, "<i8", 0, size // 8)


def derived_index(
    sources: Sequence[StrPath],
    what: str,
    count: int | None,
    build: Callable[[], Iterable[np.ndarray]],
    *,
    rebuild: bool = False,
    infos: Sequence[os.stat_result] | None = None,
) -> np.ndarray:
    """``count`` int64 values (None: as many as ``build`` yields) derived from ``sources`` by ``build``.

    ``build`` yields chunks in order and raises on bad input. The result is built once per version of
    the sources into the index cache and memory-mapped (see the module docstring); ``rebuild`` derives
    (and checks) again even when a cached copy exists. A source changed in the last seconds is not
    cached (its next change could keep the same timestamps): its derivation goes to an unlinked file.
    ``infos``: the sources' stats, taken before ``build`` reads them (as for :func:`remember_checked`).
    """
    if infos is None:
        infos = [_stat(source) for source in sources]
    key = _key(sources, what, infos)
    directory = _directory(sources)
    final = directory / f"{key}.i64"
    cached = None if rebuild else cached_index(sources, what, count, infos)
    if cached is not None:
        return cached
    if _recent(infos):
        return _derive_unlinked(what, count, build)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=f".{key}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        log.warning("index cache %s is not writable (%s): deriving %s into a temporary file", directory, exc, what)
        return _derive_unlinked(what, count, build)
    try:
        with os.fdopen(fd, "wb") as handle:
            written = _write_chunks(handle, build(), count)
        os.replace(temp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return map_array(final, "<i8", 0, written)


def _write_chunks(handle: Any, chunks: Iterable[np.ndarray], count: int | None) -> int:
    written = 0
    for chunk in chunks:
        data = np.ascontiguousarray(chunk, dtype="<i8")
        if len(data) >= 512 and not data.any():
            handle.seek(8 * len(data), os.SEEK_CUR)  # a run of zeros (empty entries) stays a hole
        else:
            handle.write(data.tobytes())
        written += len(data)
    handle.truncate(8 * written)
    if count is not None and written != count:
        raise RuntimeError(f"derived {written} index values, expected {count}")  # a reader's own bug
    return written


def _derive_unlinked(what: str, count: int | None, build: Callable[[], Iterable[np.ndarray]]) -> np.ndarray:
    try:
        handle = tempfile.TemporaryFile()  # noqa: SIM115  (closed by the with below)
    except OSError as exc:
        log.warning("no temporary file for %s (%s): the index stays in RAM", what, exc)
        return np.concatenate([np.asarray(c, dtype=np.int64) for c in build()])
    with handle:
        written = _write_chunks(handle, build(), count)
        if written == 0:
            return np.empty(0, dtype=np.int64)
        handle.flush()
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    return np.frombuffer(mapped, dtype="<i8", count=written)
