"""A remote prefix as a reader sees it: :class:`RemotePath`, a path into the listing taken at open.

A format's reader runs on it as on a local ``Path``: ``exists``, ``stat``, ``glob`` and walks answer from the
listing (every key, size and ETag); bytes come from the shard's one block cache, by blocks fetched as touched
(:class:`BlockArray`, :class:`BlockFile`) and checked against the manifest's block hashes where it records them;
an object that only a whole-file checksum can check is fetched whole and checked against it. ``os.fspath`` of a path
is its URL, so errors name the object as the user wrote it. Nothing is copied out of the cache.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

import numpy as np
import xxhash

from tokenloom.formats.errors import UnsafePathError
from tokenloom.formats.io.index_map import map_array
from tokenloom.formats.io.manifest import MANIFEST_NAME
from tokenloom.formats.io.source import LOCAL, data_suffixes
from tokenloom.formats.io.urls import StoredPath
from tokenloom.formats.remote.array import BlockArray, read_blocks
from tokenloom.formats.remote.blockfile import BlockFile
from tokenloom.formats.remote.cache import BlockCache
from tokenloom.formats.remote.client import ObjectInfo

__all__ = ["RemotePath", "RemoteSource", "RemoteTree", "relative_name"]


class RemoteSource:
    """Bytes of remote objects from the block cache (a ``Source``): a :class:`RemotePath` serves its own, any
    other path is local."""

    def __init__(self, cache: BlockCache) -> None:
        self.cache = cache

    def open(self, path: str | os.PathLike[str]) -> BinaryIO:
        return path.open() if isinstance(path, RemotePath) else LOCAL.open(path)

    def tokens(self, path: str | os.PathLike[str], dtype: np.dtype, byte_offset: int, count: int) -> Any:
        if isinstance(path, RemotePath):
            return path.array(dtype, byte_offset, count)
        return LOCAL.tokens(path, dtype, byte_offset, count)


def relative_name(obj: ObjectInfo, base_key: str) -> str:
    """``obj``'s key below ``base_key`` as a safe relative posix path (UnsafePathError for ``..`` and the like)."""
    name = obj.key[len(base_key) + 1 :] if base_key else obj.key
    parts = PurePosixPath(name).parts
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in name:
        raise UnsafePathError(
            f"object key {obj.key!r} does not name a file inside the dataset prefix",
            path=obj.url,
            hint="Rename the object (no '..', '.' or empty path parts); tokenloom does not read outside the prefix",
        )
    return name


class RemoteTree:
    """The objects under one prefix by relative name (the listing taken at open) and the cache that serves them."""

    def __init__(self, cache: BlockCache, objects: dict[str, ObjectInfo]) -> None:
        self.cache = cache
        self.objects = objects
        self.folders = {"", *(str(p) for name in objects for p in PurePosixPath(name).parents if str(p) != ".")}

    def children(self, folder: str) -> list[str]:
        prefix = f"{folder}/" if folder else ""
        found = {n[len(prefix) :].split("/", 1)[0] for n in [*self.objects, *self.folders] if n.startswith(prefix)}
        return sorted(found - {""})


def _stat(mode: int, ino: int, size: int) -> os.stat_result:
    return os.stat_result((mode, ino, 0, 1, 0, 0, size, 0, 0, 0), {"st_mtime_ns": 0, "st_ctime_ns": 0})


class RemotePath(StoredPath):
    """A file or folder of a :class:`RemoteTree`, with the subset of ``pathlib.Path`` readers use."""

    __slots__ = ("relative", "tree")

    def __init__(self, tree: RemoteTree, relative: str = "") -> None:
        self.tree, self.relative = tree, relative.strip("/")

    # -- names ----------------------------------------------------------------------------------------------
    def __fspath__(self) -> str:
        return self.tree.cache.config.url.url(self.relative)

    __str__ = __fspath__

    def __repr__(self) -> str:
        return f"RemotePath({self.__fspath__()!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and other.tree is self.tree and other.relative == self.relative

    def __hash__(self) -> int:
        return hash(self.relative)

    def __lt__(self, other: RemotePath) -> bool:
        return self.relative < other.relative

    def __truediv__(self, name: str | os.PathLike[str]) -> RemotePath:
        joined = os.path.normpath(os.path.join(self.relative, os.fspath(name)))  # ".." only from ``parent``
        return RemotePath(self.tree, "" if joined == "." else joined)

    _pure = property(lambda self: PurePosixPath(self.relative or "."))
    name = property(lambda self: self._pure.name)
    suffix = property(lambda self: self._pure.suffix)
    stem = property(lambda self: self._pure.stem)
    parent = property(lambda self: self / ".." if self.relative else self)

    def with_name(self, name: str) -> RemotePath:
        return self.parent / name

    def relative_to(self, other: RemotePath) -> PurePosixPath:
        return self._pure.relative_to(other._pure)

    def resolve(self) -> RemotePath:
        return self

    absolute = resolve

    # -- the listing ----------------------------------------------------------------------------------------
    def info(self) -> ObjectInfo:
        obj = self.tree.objects.get(self.relative)
        if obj is None:
            raise FileNotFoundError(2, "no such object", self.__fspath__())
        return obj

    def is_file(self) -> bool:
        return self.relative in self.tree.objects

    def is_dir(self) -> bool:
        return self.relative in self.tree.folders

    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def is_symlink(self) -> bool:
        return False

    def stat(self) -> os.stat_result:
        """The object's size, and its ETag as the inode (a changed object is another version; indexes derived from
        it are keyed by that). Nothing is fetched."""
        if self.is_dir():
            return _stat(stat.S_IFDIR | 0o555, 0, 0)
        obj = self.info()
        ino = xxhash.xxh3_64_intdigest(f"{obj.url}\0{obj.etag}".encode()) >> 1
        return _stat(stat.S_IFREG | 0o444, ino, obj.size)

    def iterdir(self) -> Iterator[RemotePath]:
        return iter([self / name for name in self.tree.children(self.relative)])

    def glob(self, pattern: str) -> Iterator[RemotePath]:
        return iter([p for p in self.iterdir() if fnmatch.fnmatchcase(p.name, pattern)])

    def walk(self) -> Iterator[tuple[RemotePath, list[str], list[str]]]:
        """``os.walk`` over the listing, top down."""
        children = list(self.iterdir())
        folders = [p.name for p in children if p.is_dir()]
        yield self, folders, [p.name for p in children if p.is_file()]
        for name in folders:
            yield from (self / name).walk()

    # -- bytes ----------------------------------------------------------------------------------------------
    @property
    def index_dir(self) -> Path:
        return self.tree.cache.root / "index-v1"

    def by_blocks(self) -> bool:
        """Read by cache blocks (fetched as touched) unless only a manifest's whole-file checksum can check it: then
        fetched whole, checked against it (an index of a manifest written before block hashes). The manifest is
        the copy fetched whole and self-checked at open."""
        cache, key = self.tree.cache, self.info().key
        if self.name == MANIFEST_NAME:
            return False
        if self.relative.endswith(data_suffixes()) or cache.expected.checks(key, cache.block_size, False):
            return True
        return not cache.expected.checks(key, cache.block_size, True)

    def open(self, mode: str = "rb") -> BinaryIO:
        if mode != "rb":
            raise OSError(f"{self} is read-only (mode {mode!r})")
        obj = self.info()
        if self.by_blocks():
            return BlockFile(self.tree.cache, obj)  # pyright: ignore[reportReturnType]
        return open(self.tree.cache.whole(obj), "rb")

    def read_bytes(self) -> bytes:
        with self.open() as handle:
            return handle.read()

    def read(self, start: int, stop: int) -> np.ndarray:
        """Bytes ``[start, stop)`` by cache blocks (only those the range covers), copied out: this process keeps no
        page of them (an index read by blocks, :class:`~tokenloom.formats.io.index_blocks.IndexBlocks`)."""
        found = np.empty(stop - start, dtype=np.uint8)
        read_blocks(self.tree.cache, self.info(), start, found.data, release=True)
        return found

    def discard(self) -> None:
        """Delete every cached block of this object (a check failed: fetched again at next use)."""
        self.tree.cache.discard(self.info())

    def array(self, dtype: np.dtype | str, byte_offset: int, count: int) -> Any:
        """``count`` values of ``dtype`` at ``byte_offset``: by blocks, or mapped from a copy fetched whole."""
        obj = self.info()
        if self.by_blocks():
            return BlockArray(self.tree.cache, obj, np.dtype(dtype), byte_offset, count)
        return map_array(self.tree.cache.whole(obj), dtype, byte_offset, count)
