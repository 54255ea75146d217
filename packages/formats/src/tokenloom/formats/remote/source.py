"""A remote prefix as a reader sees it: a local *view* directory plus a :class:`RemoteSource` for data bytes.

Every format's reader runs unchanged on the view (``tokenloom.formats.io.source``): index and metadata
objects (``.idx``, ``manifest.json``, sidecars, ``meta.json``, tatm metadata, document lengths) are fetched
whole into the cache and linked into the view, so stat, glob, detection and index parsing are the
local ones; data objects (``.bin``, ``.npy``, ``.pbin``, ``.h5``/``.hdf5``) appear as sparse placeholders
of their exact size, and their bytes come only through the source: :class:`BlockArray` for token
arrays, :class:`BlockFile` for headers, a ``.pbin``'s pickled index and HDF5 files (h5py reads the file
object, touching only the blocks that hold its metadata and the slices asked for).

The view lives at ``CACHE/v1/<hash of URL>/view-<hash of the listing>`` (every key, size and ETag):
another object version is another view, never a stale one. It is built in a temp directory and
renamed into place, so concurrent openers on one node agree.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

import numpy as np
import orjson

from tokenloom.formats.errors import UnsafePathError
from tokenloom.formats.io.source import LOCAL, REMOTE_VIEW_MARKER, data_suffixes
from tokenloom.formats.io.storage import storage_errors
from tokenloom.formats.remote._cachedir import named_cache_errors
from tokenloom.formats.remote.array import BlockArray
from tokenloom.formats.remote.blockfile import BlockFile
from tokenloom.formats.remote.cache import BlockCache
from tokenloom.formats.remote.client import ObjectInfo

__all__ = ["RemoteSource", "build_view"]


class RemoteSource:
    """Data bytes of remote objects from the block cache (a ``Source``): the one place a remote shard keeps its
    cache, whatever its format (``shard.source.cache``).

    ``objects``: the object behind each local path a reader names (a view's files, or a native shard's ``.bin``
    key); any other path is read locally.
    """

    def __init__(self, cache: BlockCache, objects: dict[str, ObjectInfo]) -> None:
        self.cache = cache
        self.objects = objects

    def object_of(self, path: str | os.PathLike[str]) -> ObjectInfo | None:
        return self.objects.get(os.fspath(Path(path)))

    def open(self, path: str | os.PathLike[str]) -> BinaryIO:
        obj = self.object_of(path)
        return LOCAL.open(path) if obj is None else BlockFile(self.cache, obj)  # pyright: ignore[reportReturnType]

    def tokens(self, path: str | os.PathLike[str], dtype: np.dtype, byte_offset: int, count: int) -> Any:
        obj = self.object_of(path)
        if obj is None:
            return LOCAL.tokens(path, dtype, byte_offset, count)
        return BlockArray(self.cache, obj, dtype, byte_offset, count)


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


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


@named_cache_errors
def build_view(cache: BlockCache, objects: dict[str, ObjectInfo]) -> Path:
    """The local view of ``objects`` (relative name -> object): index objects whole, data objects as placeholders."""
    listing = orjson.dumps(sorted((name, o.size, o.etag) for name, o in objects.items()))
    home = cache.root / "v1" / _digest(str(cache.config.url).encode())
    view = home / f"view-{_digest(listing)}"
    if view.is_dir():
        return view
    with storage_errors(home, "building the local view of a remote dataset"):
        home.mkdir(parents=True, exist_ok=True)
        temp = home / f".view-{os.getpid()}-{os.urandom(4).hex()}.tmp"
        try:
            temp.mkdir()
            (temp / REMOTE_VIEW_MARKER).write_bytes(b"")
            for name, obj in sorted(objects.items()):
                target = temp / name
                target.parent.mkdir(parents=True, exist_ok=True)
                if name.endswith(data_suffixes()):
                    with open(target, "xb") as handle:
                        handle.truncate(obj.size)  # sparse: its bytes come from the blocks, never from here
                    continue
                whole = cache.whole(obj)
                try:
                    os.link(whole, target)
                except OSError:
                    shutil.copyfile(whole, target)
            with contextlib.suppress(OSError):
                os.rename(temp, view)  # another process may have published the same view first
        finally:
            shutil.rmtree(temp, ignore_errors=True)
    return view
