"""Keyed store backend: HDF5 files, one group per key, one 1-D dataset per segment (AstrAI's H5Store).

::

    /sequence/data_0, /sequence/data_1, ...     segments of the key "sequence"
    /loss_mask/data_0, /loss_mask/data_1, ...   the same lengths, segment by segment

Segments are ordered by the number in ``data_<n>`` (names that do not follow
that pattern are ordered by name); tokenloom writes zero-padded names, so name
order and number order agree. AstrAI's H5Store iterated ``group.keys()`` (name
order: data_0, data_1, data_10, ...); a store with unpadded names where the two
orders differ is read in number order with a warning that says so. A directory of ``.h5`` / ``.hdf5`` files is
one store whose segments follow file order (sorted paths). h5py is the optional
extra ``tokenloom-formats[h5]``; files are opened lazily in each process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tokenloom.formats._contract import Validate
from tokenloom.formats._dataset import Shard
from tokenloom.formats.errors import (
    DataError,
    FormatError,
    MissingFileError,
    MissingKeyError,
    TruncatedError,
    UnsafePathError,
)
from tokenloom.formats.io.optional import require
from tokenloom.formats.io.paths import names_in, safe_file, walk
from tokenloom.formats.io.source import LOCAL, Source, current_source
from tokenloom.formats.keyed.store import (
    DEFAULT_MAX_ELEMENTS,
    KeyedStore,
    StoreTokenReader,
    check_finite,
    check_key_name,
    check_length,
)

__all__ = ["H5_SUFFIXES", "H5Store", "find_h5_files", "h5py_module", "is_h5_store", "key_segments", "open_h5_dataset"]

log = logging.getLogger(__name__)

H5_SUFFIXES = (".h5", ".hdf5")
_SEGMENT_NAME = re.compile(r"data_(\d+)")
_CHUNK = 1 << 22


@contextlib.contextmanager
def _h5_errors(path: Path) -> Iterator[None]:
    """Turn what h5py raises on a damaged file (OSError, RuntimeError, KeyError, ...) into a FormatError."""
    try:
        yield
    except DataError:
        raise
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
        raise FormatError(
            f"the HDF5 file is damaged or not a keyed store ({type(exc).__name__}: {exc})",
            path=path,
            hint="Restore the file or re-create the store",
        ) from None


def h5py_module() -> Any:
    return require("h5py", distribution="tokenloom-formats", extra="h5", purpose="HDF5 keyed stores")


def _h5_file(source: Source, path: Path) -> Any:
    """``path`` opened read-only by h5py: by name locally, else through the source's file object."""
    if source is LOCAL:
        return h5py_module().File(path, "r")
    return h5py_module().File(source.open(path), "r")


def find_h5_files(root: Path) -> list[Path]:
    found = []
    for directory, dirnames, filenames in walk(root):
        dirnames.sort()
        found += [directory / name for name in filenames if name.endswith(H5_SUFFIXES)]
    return sorted(found, key=lambda p: p.relative_to(root).parts)


def is_h5_store(path: Path) -> bool:
    if path.is_file():
        return path.suffix in H5_SUFFIXES
    return path.is_dir() and any(_suffix(name) in H5_SUFFIXES for name in names_in(path))


def _suffix(name: str) -> str:
    """``Path(name).suffix``, without making a Path (a directory may hold thousands of shard files)."""
    dot = name.rfind(".")
    return name[dot:] if 0 < dot < len(name) - 1 else ""


def _segment_order(names: list[str], *, path: Path | None = None, key: str = "") -> list[str]:
    if all(_SEGMENT_NAME.fullmatch(n) for n in names):
        by_number = sorted(names, key=lambda n: int(n[5:]))
        if path is not None and by_number != sorted(names):
            log.warning(
                "%s: the %d segments of key %r are read in number order (data_0, data_1, ..., data_10); "
                "AstrAI's H5Store iterated them in name order (data_0, data_1, data_10, ...), so a run there "
                "read this key's tokens in another order (stores tokenloom writes use zero-padded names)",
                path, len(names), key,
            )  # fmt: skip
        return by_number
    return sorted(names)


def key_segments(
    handle: Any, path: Path, dtypes: dict[str, np.dtype], *, max_elements: int = DEFAULT_MAX_ELEMENTS
) -> dict[str, list[tuple[str, int]]]:
    """Each key group of an open HDF5 file: its segments (dataset name, length) in segment order, every one a
    plain 1-D dataset in this file of one dtype per key (``dtypes``: filled, and checked across files)."""
    h5py = h5py_module()
    found: dict[str, list[tuple[str, int]]] = {}
    for key in sorted(handle.keys()):
        group = _hard_member(handle, key, h5py.Group, "group", path)
        check_key_name(key, path=path)
        found[key] = []
        for name in _segment_order(list(group.keys()), path=path, key=key):
            dataset = _hard_member(group, name, h5py.Dataset, "dataset", path)
            if dataset.is_virtual or dataset.external:
                raise UnsafePathError(
                    f"{key}/{name} stores its data in other files (virtual or external dataset)", path=path, field=key
                )
            if dataset.ndim != 1:
                raise FormatError(f"{key}/{name} has shape {dataset.shape}, expected 1-D", path=path, field=key)
            dtype = KeyedStore._check_dtype(dataset.dtype.name, path=path, key=key)
            if dtypes.setdefault(key, dtype) != dtype:
                raise FormatError(
                    f"{key}/{name} is {dtype.name}, earlier segments of {key} are {dtypes[key].name}",
                    path=path,
                    field=key,
                )
            check_length(int(dataset.shape[0]), max_elements, path=path, key=key)
            found[key].append((name, int(dataset.shape[0])))
    return found


def _hard_member(parent: Any, name: str, kind: type, what: str, path: Path) -> Any:
    link = parent.get(name, getlink=True)
    if not isinstance(link, h5py_module().HardLink):
        raise UnsafePathError(
            f"{parent.name.rstrip('/')}/{name} is a {type(link).__name__}, expected a plain {what}",
            path=path,
            field=name,
            hint="Soft and external links can point outside the store; copy the data into the file",
        )
    member = parent[name]
    if not isinstance(member, kind):
        raise FormatError(f"{parent.name.rstrip('/')}/{name} is not a {what}", path=path, field=name)
    return member


class H5Store(KeyedStore):
    """HDF5 keyed store; datasets are read (copied) slice by slice, never loaded whole."""

    format = "h5"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._paths: list[Path] = []
        self._segments: dict[str, list[tuple[int, str]]] = {}  # key -> [(file index, dataset path)]
        self._files: dict[int, Any] = {}
        self._source: Source = current_source()

    def _close(self) -> None:
        files, self._files = getattr(self, "_files", {}), {}
        if self._pid == os.getpid():  # never close a handle another process opened
            for handle in files.values():
                handle.close()

    def _load(self, path: Path) -> tuple[list[int], np.ndarray | None]:
        self._source = current_source()
        if path.is_file() or path.is_symlink():
            root, paths = path.parent, [path]
        elif path.is_dir():
            root, paths = path, find_h5_files(path)
            if not paths:
                raise MissingFileError("no .h5 / .hdf5 files in the directory", path=path)
        else:
            raise MissingFileError(f"{path.name} does not exist", path=path)
        segments: dict[str, list[tuple[int, str]]] = {}
        lengths: dict[str, list[int]] = {}
        dtypes: dict[str, np.dtype] = {}
        first_keys: list[str] | None = None
        for index, file_path in enumerate(paths):
            safe_file(root, file_path)
            try:
                handle = _h5_file(self._source, file_path)
            except OSError as exc:
                raise FormatError(f"not a readable HDF5 file ({exc})", path=file_path) from None
            with handle, _h5_errors(file_path):
                found = key_segments(handle, file_path, dtypes, max_elements=self.max_elements)
                keys = sorted(found)
                if first_keys is None:
                    first_keys = keys
                elif keys != first_keys:
                    raise MissingKeyError(f"keys {keys} differ from {first_keys} in {paths[0].name}", path=file_path)
                for key, parts in found.items():
                    for name, length in parts:
                        segments.setdefault(key, []).append((index, f"{key}/{name}"))
                        lengths.setdefault(key, []).append(length)
                        if self.validate != Validate.NONE and dtypes[key].kind == "f":
                            dataset = handle[key][name]
                            for start in range(0, length, _CHUNK):
                                check_finite(
                                    dataset[start : start + _CHUNK],
                                    key=key,
                                    path=file_path,
                                    record=len(lengths[key]) - 1,
                                )
                    segments.setdefault(key, [])
                    lengths.setdefault(key, [])
        if not first_keys:
            raise FormatError("the HDF5 file holds no key groups", path=paths[0])
        aligned = self._check_aligned(lengths, path=path)
        self._paths, self._segments, self._keys = paths, segments, list(first_keys)
        self._dtypes = {key: dtypes.get(key, np.dtype("int64")) for key in first_keys}
        return aligned, None

    def _read(self, key: str, segment: int, start: int, stop: int) -> np.ndarray:
        self._handles_valid()
        file_index, name = self._segments[key][segment]
        with _h5_errors(self._paths[file_index]):
            handle = self._files.get(file_index)
            if handle is None:
                handle = _h5_file(self._source, self._paths[file_index])
                self._files[file_index] = handle
            return np.asarray(handle[name][start:stop])


def _h5_shards(store: H5Store, key: str, token_dtype: np.dtype, path: Path) -> list[Shard]:
    """Zero-copy: one shard (one entry) per segment.

    Works for contiguous, uncompressed little-endian datasets (h5py's default
    layout), whose bytes sit at a fixed offset in the file.
    """
    shards = []
    for file_index, name in store._segments[key]:
        file_path = store._paths[file_index]
        with _h5_errors(file_path), _h5_file(store._source, file_path) as handle:
            dataset = handle[name]
            length = int(dataset.shape[0])
            offset = dataset.id.get_offset()
            if length and (offset is None or dataset.compression or dataset.dtype.byteorder == ">"):
                raise FormatError(
                    f"{name} is chunked, compressed or big-endian and cannot be memory-mapped",
                    path=file_path,
                    field=key,
                    hint="Read it with open_store(path).fetch, or rewrite it with tokenloom's h5 writer",
                )
        offset = int(offset or 0)
        if offset + length * token_dtype.itemsize > file_path.stat().st_size:
            raise TruncatedError(f"{name} reaches past the end of the file", path=file_path, offset=offset, field=key)
        shards.append(
            Shard.single_entry(file_path, token_dtype, length, tokens_offset=offset, name=f"{file_path.name}:{name}")
        )
    if not shards:  # an empty store: one empty shard, no entries
        empty = path if path.is_file() else store._paths[0]
        shards.append(Shard(empty, token_dtype, 0, np.zeros(1, np.int64), np.zeros(0, np.uint16), name="empty"))
    return shards


#: An HDF5 store's token key (``key=``, default ``sequence``) as a TokenDataset.
open_h5_dataset = StoreTokenReader("h5", H5Store, _h5_shards)
