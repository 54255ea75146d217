"""Keyed store backend: raw ``<key>.bin`` files described by ``meta.json`` (AstrAI's MmapStore).

A directory (and any sub-directories, each one segment, in sorted path order)
holds ``meta.json`` and one ``<key>.bin`` per key::

    meta.json  {"sequence": {"shape": [N], "dtype": "int64", "offsets": [0, n0, ..., N]}, ...}
    sequence.bin   N little-endian elements of that dtype, nothing else

``offsets`` (optional) are record boundaries inside the file. Every key of a
directory has the same N (and the same offsets where both have them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson

from tokenloom.formats._contract import Validate
from tokenloom.formats._dataset import Shard
from tokenloom.formats.errors import (
    FormatError,
    IndexCorruptError,
    MissingFileError,
    MissingKeyError,
    ResourceLimitError,
    ShapeMismatchError,
)
from tokenloom.formats.io.output import refuse_unfinished
from tokenloom.formats.io.paths import safe_file, walk
from tokenloom.formats.io.scan import check_exact_size
from tokenloom.formats.io.source import current_source
from tokenloom.formats.keyed.store import KeyedStore, StoreTokenReader, check_finite, check_key_name, check_length

__all__ = ["META_NAME", "BinStore", "Part", "find_meta_files", "is_bin_store", "open_bin_meta_dataset"]

META_NAME = "meta.json"
MAX_META_BYTES = 64 << 20


def find_meta_files(root: Path) -> list[Path]:
    """Every meta.json under ``root`` (symlinked directories are not followed), sorted by path."""
    found = []
    for directory, dirnames, filenames in walk(root):
        dirnames.sort()
        if META_NAME in filenames:
            found.append(directory / META_NAME)
    return sorted(found, key=lambda p: p.relative_to(root).parts)


def is_bin_store(path: Path) -> bool:
    return path.is_dir() and (path / META_NAME).is_file()


class Part:
    """One meta.json directory (or a record store's .h5 file): per key its file, dtype, length and record
    offsets, the arrays mapped lazily per process from the source it was read through (a remote store's block
    cache, pickled with it, else the local files)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.files: dict[str, Path] = {}
        self.dtypes: dict[str, np.dtype] = {}
        self.lengths: dict[str, int] = {}
        self.offsets: dict[str, np.ndarray] = {}
        self.stream_keys: list[str] = []  # a record store's keys without offsets (not served)
        self.groups: np.ndarray | None = None  # a record store's response-record boundaries per prompt (GRPO)
        self.maps: dict[str, np.ndarray] = {}
        self.source = current_source()

    def array(self, key: str) -> np.ndarray:
        if key not in self.maps:
            self.maps[key] = self.source.tokens(self.files[key], self.dtypes[key], 0, self.lengths[key])
        return self.maps[key]

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["maps"] = {}
        return state


class BinStore(KeyedStore):
    """``<key>.bin`` + ``meta.json`` directories, memory-mapped per process (zero-copy reads)."""

    format = "bin"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._parts: list[Part] = []

    def _close(self) -> None:
        for part in self._parts:
            part.maps = {}

    def _load(self, path: Path) -> tuple[list[int], np.ndarray | None]:
        if not path.is_dir():
            raise FormatError("a bin store is a directory holding meta.json and <key>.bin files", path=path)
        refuse_unfinished(path, what="store")
        metas = find_meta_files(path)
        if not metas:
            raise MissingFileError(f"no {META_NAME} under the directory", path=path)
        parts = [self._read_part(path, meta) for meta in metas]
        keys = sorted(parts[0].files)
        for part in parts[1:]:
            if sorted(part.files) != keys:
                raise MissingKeyError(
                    f"keys {sorted(part.files)} differ from {keys} in {parts[0].directory / META_NAME}",
                    path=part.directory / META_NAME,
                )
        dtypes = {key: parts[0].dtypes[key] for key in keys}
        for part in parts[1:]:
            for key in keys:
                if part.dtypes[key] != dtypes[key]:
                    raise FormatError(
                        f"{key} is {part.dtypes[key].name} here, {dtypes[key].name} in the first directory",
                        path=part.directory / META_NAME,
                        field=key,
                    )
        lengths = self._check_aligned({key: [part.lengths[key] for part in parts] for key in keys}, path=path)
        records = self._records(parts, lengths)
        self._parts, self._keys, self._dtypes = parts, keys, dtypes
        if self.validate != Validate.NONE:
            for segment, part in enumerate(parts):
                for key in keys:
                    if dtypes[key].kind == "f":
                        check_finite(part.array(key), key=key, path=part.files[key], record=segment)
        return lengths, records

    def _read_part(self, root: Path, meta_path: Path) -> Part:
        safe_file(root, meta_path)
        size = meta_path.stat().st_size
        if size > MAX_META_BYTES:
            raise ResourceLimitError(f"{META_NAME} has {size} bytes, more than {MAX_META_BYTES}", path=meta_path)
        try:
            meta = orjson.loads(meta_path.read_bytes())
        except orjson.JSONDecodeError as exc:
            raise FormatError(f"{META_NAME} is not valid JSON ({exc})", path=meta_path) from None
        if not isinstance(meta, dict) or not meta:
            raise FormatError(f"{META_NAME} is not an object of keys", path=meta_path)
        part = Part(meta_path.parent)
        for key, info in meta.items():
            check_key_name(key, path=meta_path)
            if not isinstance(info, dict):
                raise FormatError(f"{key} entry is not an object", path=meta_path, field=key)
            shape = info.get("shape")
            if not isinstance(shape, list) or len(shape) != 1 or type(shape[0]) is not int or shape[0] < 0:
                raise FormatError(
                    f"{key} has shape {shape!r:.60}, expected [length] (a 1-D array)", path=meta_path, field=key
                )
            length = shape[0]
            check_length(length, self.max_elements, path=meta_path, key=key)
            dtype_name = info.get("dtype")
            dtype = self._check_dtype(
                dtype_name if isinstance(dtype_name, str) else repr(dtype_name), path=meta_path, key=key
            )
            data_path = part.directory / f"{key}.bin"
            if not data_path.exists() and not data_path.is_symlink():
                raise MissingFileError(f"{META_NAME} lists {key} but {data_path.name} is missing", path=data_path)
            safe_file(root, data_path)
            expected = length * dtype.itemsize
            actual = data_path.stat().st_size
            problem = f"{data_path.name} has {actual} bytes, {META_NAME} declares {length} x {dtype.name} = {expected}"
            check_exact_size(actual, expected, problem, path=data_path, field=key)
            if "offsets" in info:
                part.offsets[key] = self._check_offsets(info["offsets"], length, path=meta_path, key=key)
            part.files[key], part.dtypes[key], part.lengths[key] = data_path, dtype, length
        return part

    def _check_offsets(self, offsets: object, length: int, *, path: Path, key: str) -> np.ndarray:
        if not isinstance(offsets, list) or not all(type(v) is int for v in offsets):
            raise IndexCorruptError(f"{key} offsets are not a list of ints", path=path, field=f"{key}.offsets")
        if len(offsets) > self.max_elements + 1:
            raise ResourceLimitError(
                f"{key} lists {len(offsets)} offsets, more than the cap", path=path, field=f"{key}.offsets"
            )
        if not offsets or offsets[0] != 0 or offsets[-1] != length:
            raise IndexCorruptError(
                f"{key} offsets run from {offsets[0] if offsets else None} to {offsets[-1] if offsets else None}, "
                f"expected 0 to {length}",
                path=path,
                field=f"{key}.offsets",
            )
        array = np.asarray(offsets, dtype=np.int64)
        steps = np.diff(array)
        if (steps < 0).any():
            record = int(np.argmax(steps < 0))
            raise IndexCorruptError(f"{key} offsets decrease", path=path, record=record, field=f"{key}.offsets")
        return array

    @staticmethod
    def _records(parts: list[Part], lengths: list[int]) -> np.ndarray | None:
        """Global record boundaries when every directory has offsets (equal across its keys)."""
        pieces = []
        base = 0
        for part, length in zip(parts, lengths, strict=True):
            keyed = sorted(part.offsets)
            for key in keyed[1:]:
                if not np.array_equal(part.offsets[key], part.offsets[keyed[0]]):
                    raise ShapeMismatchError(
                        f"{key} offsets differ from {keyed[0]} offsets", path=part.directory / META_NAME, field=key
                    )
            if not keyed:
                return None
            pieces.append(part.offsets[keyed[0]][:-1] + base)
            base += length
        return np.concatenate([*pieces, np.array([base], dtype=np.int64)])

    def _read(self, key: str, segment: int, start: int, stop: int) -> np.ndarray:
        self._handles_valid()
        return self._parts[segment].array(key)[start:stop]


def _bin_meta_shards(store: BinStore, key: str, token_dtype: np.dtype, path: Path) -> list[Shard]:
    """One shard per directory, records as entries."""
    shards = []
    for part in store._parts:
        length = part.lengths[key]
        offsets = part.offsets.get(key, np.array([0, length], dtype=np.int64))
        shards.append(
            Shard(
                tokens_path=part.files[key],
                dtype=token_dtype,
                num_tokens=length,
                offsets=offsets,
                overlap_prefix=np.zeros(len(offsets) - 1, dtype=np.uint16),
                name=str(part.directory.relative_to(path)),
            )
        )
    return shards


#: A bin store's token key (``key=``, default ``sequence``) as a TokenDataset.
open_bin_meta_dataset = StoreTokenReader("bin-meta", BinStore, _bin_meta_shards)
