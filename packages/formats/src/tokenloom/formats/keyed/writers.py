"""Writers of keyed stores, with the TokenWriter shape (context manager, ``add``) plus ``add_keyed``.

``add_keyed({key: array, ...})`` appends one segment (HDF5: one dataset per key)
or one record (bin: a span of each ``<key>.bin`` recorded in ``offsets``); all
arrays of one call have the same length. ``add(tokens)`` is
``add_keyed({"sequence": tokens})``, so any token dataset converts into a seq
store. Token keys are checked against the vocabulary, float keys for NaN/Inf,
other keys against their dtype (default uint8 for masks).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any, Unpack

import numpy as np
import orjson

from tokenloom.formats._writer import TokenWriter, WriterBasics, check_tokens
from tokenloom.formats.errors import ConfigError, MissingKeyError, ShapeMismatchError
from tokenloom.formats.io.atomic import (
    TMP_SUFFIX,
    WRITING_MARKER,
    TempFile,
    atomic_write_bytes,
    fsync_dir,
)
from tokenloom.formats.io.output import start_output_dir
from tokenloom.formats.keyed.bin_meta import META_NAME
from tokenloom.formats.keyed.h5 import H5_SUFFIXES, h5py_module
from tokenloom.formats.keyed.records import GROUPED_KEYS, write_record_manifest
from tokenloom.formats.keyed.records_h5 import segment_name
from tokenloom.formats.keyed.store import (
    FLOAT_KEYS,
    KEY_DTYPES,
    OPTIONAL_TRAIN_TYPE_KEYS,
    TOKEN_KEYS,
    TRAIN_TYPE_KEYS,
    WIDE_KEYS,
    check_finite,
    check_key_name,
)

__all__ = ["BinMetaStoreWriter", "H5StoreWriter", "RecordH5Writer", "RecordStoreWriter", "StoreWriter"]


class StoreWriter(TokenWriter):
    """Base of the keyed store writers.

    Args:
        path: the store to create.
        dtype: dtype of the token keys (sequence, chosen, rejected, prompts, responses).
        train_type: seq / sft / dpo / grpo: fixes the keys every ``add_keyed`` must give.
            Without it, the first ``add_keyed`` fixes them.
        key_dtypes: dtypes of other keys (default: float32 for rewards, int32 for position_ids,
            uint8 otherwise).
        overwrite: replace an existing store.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        train_type: str | None = None,
        key_dtypes: Mapping[str, Any] | None = None,
        overwrite: bool = False,
        **basics: Unpack[WriterBasics],
    ) -> None:
        super().__init__(path, **basics)
        if train_type is not None and train_type not in TRAIN_TYPE_KEYS:
            raise ConfigError(
                f"train_type {train_type!r}, expected one of {sorted(TRAIN_TYPE_KEYS)}",
                field="train_type",
            )
        self.keys: list[str] | None = sorted(TRAIN_TYPE_KEYS[train_type]) if train_type else None
        self._optional = OPTIONAL_TRAIN_TYPE_KEYS.get(train_type or "", ())
        self.key_dtypes = {k: np.dtype(v).newbyteorder("<") for k, v in (key_dtypes or {}).items()}
        for key, key_dtype in self.key_dtypes.items():
            if key_dtype.name not in KEY_DTYPES:
                raise ConfigError(f"dtype {key_dtype.name} for {key}, expected one of {sorted(KEY_DTYPES)}", field=key)
        self.overwrite = overwrite

    def dtype_of(self, key: str) -> np.dtype:
        if key in self.key_dtypes:
            return self.key_dtypes[key]
        if key in TOKEN_KEYS:
            return self.dtype
        if key in WIDE_KEYS:
            return WIDE_KEYS[key]
        return np.dtype("<f4") if key in FLOAT_KEYS else np.dtype("u1")

    def add_keyed(self, arrays: Mapping[str, Any]) -> None:
        """Append one segment: an array per key, all of one length."""
        keys = self._keys_of(arrays, "add_keyed")
        checked = {key: self._checked(key, arrays[key]) for key in keys}
        length = len(checked[keys[0]])
        for key in keys[1:]:
            if len(checked[key]) != length:
                raise ShapeMismatchError(
                    f"{key} has {len(checked[key])} elements, {keys[0]} has {length}",
                    path=self.path,
                    record=self.num_documents,
                    field=key,
                )
        self._write_segment(checked)
        self.num_documents += 1
        self.num_tokens += length

    def _keys_of(self, arrays: Mapping[str, Any], method: str) -> list[str]:
        """The sorted keys of one ``add_keyed`` / ``add_record`` call, checked against the store's keys."""
        if self._closed:
            raise ConfigError("the writer is closed", path=self.path)
        keys = sorted(arrays)
        for key in keys:
            check_key_name(key, path=self.path)
        if self.keys is None:
            if not keys:
                raise ConfigError(f"{method} needs at least one key", path=self.path)
            self.keys = keys
        if self.num_documents == 0 and keys == sorted([*self.keys, *self._optional]):
            self.keys = keys  # an optional key (sft position_ids), then required in every segment
        if keys != self.keys:
            raise MissingKeyError(
                f"segment {self.num_documents} has keys {keys}, expected {self.keys}",
                path=self.path,
                record=self.num_documents,
            )
        return keys

    def _checked(self, key: str, values: Any) -> np.ndarray:
        array = np.asarray(values)
        target = self.dtype_of(key)
        record = self.num_documents
        if array.ndim != 1:
            raise ShapeMismatchError(f"{key} has shape {array.shape}, expected 1-D", path=self.path, record=record)
        if target.kind == "f":
            if array.size and array.dtype.kind not in "iuf":
                raise ConfigError(f"{key} has dtype {array.dtype}, expected numbers", path=self.path, field=key)
            array = array.astype(target)
            check_finite(array, key=key, path=self.path, record=record)
            return array
        if array.dtype.kind == "b":
            array = array.astype(np.uint8)
        if target.kind == "b":
            return array.astype(target)
        vocab = self.vocab_size if key in TOKEN_KEYS else None
        return check_tokens(array, target, vocab, path=self.path, record=record)

    def _write_batch(self, tokens: np.ndarray, lengths: np.ndarray, overlaps: np.ndarray) -> None:
        self._refuse_overlaps(overlaps, "keyed stores")
        if self.keys not in (None, ["sequence"]):
            raise ConfigError(
                f"add() writes the key 'sequence' but this store's keys are {self.keys}",
                path=self.path,
                hint="Use add_keyed({key: array, ...})",
            )
        self.keys = ["sequence"]
        ends = np.cumsum(lengths)
        for start, end in zip((ends - lengths).tolist(), ends.tolist(), strict=True):
            self._write_segment({"sequence": tokens[start:end]})  # TokenWriter counts these entries

    def _write_segment(self, arrays: dict[str, np.ndarray]) -> None:
        raise NotImplementedError


class _H5Output(StoreWriter):
    """What the HDF5 writers share: one file written under a temp name, fsynced and renamed at commit."""

    def _open_h5(self) -> None:
        if self.path.suffix not in H5_SUFFIXES:
            raise ConfigError(f"{self.path.name} does not end in .h5 or .hdf5", path=self.path)
        if (self.path.exists() or self.path.is_symlink()) and not self.overwrite:
            raise ConfigError(
                f"{self.path.name} exists",
                path=self.path,
                hint="Choose a new path or pass --overwrite (overwrite=True in Python)",
            )
        h5py = h5py_module()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._out = TempFile(self.path)  # h5py writes the temp file by name; its handle fsyncs it at commit
        try:
            self._file = h5py.File(self._out.tmp, "w")
        except BaseException:  # h5py could not even start the file (a full disk): neither temp file nor handle stays
            self._out.abort()
            raise
        self._counts: dict[str, int] = {}  # datasets written per key

    def _write_segment(self, arrays: dict[str, np.ndarray]) -> None:
        """A dataset per key, named by its number in the key (``segment_name``: name order is number order)."""
        for key, array in arrays.items():
            number = self._counts.get(key, 0)
            group = self._file.require_group(key)
            group.create_dataset(segment_name(number), data=np.ascontiguousarray(array, array.dtype.newbyteorder("<")))
            self._counts[key] = number + 1

    def _commit(self) -> None:
        try:
            for key in self.keys or ["sequence"]:  # an empty store is an empty seq store
                self._file.require_group(key)
            self._file.close()
            self._out.publish()
        except BaseException:
            self._abort()
            raise

    def _abort(self) -> None:
        with contextlib.suppress(Exception):
            self._file.close()
        self._out.abort()


class H5StoreWriter(_H5Output):
    """An HDF5 store: group per key, ``data_<n>`` dataset per segment (contiguous, uncompressed)."""

    format = "h5"

    def __init__(self, path: str | os.PathLike[str], **options: Any) -> None:
        super().__init__(path, **options)
        self._open_h5()


class BinMetaStoreWriter(StoreWriter):
    """A ``<key>.bin`` + ``meta.json`` directory; meta.json (with record offsets) is written last."""

    format = "bin-meta"

    def __init__(self, path: str | os.PathLike[str], **options: Any) -> None:
        super().__init__(path, **options)
        start_output_dir(self.path, overwrite=self.overwrite)
        self._handles: dict[str, TempFile] = {}
        self._offsets: list[int] = [0]

    def _write_segment(self, arrays: dict[str, np.ndarray]) -> None:
        self._append(arrays)
        self._offsets.append(self._offsets[-1] + len(next(iter(arrays.values()))))

    def _append(self, arrays: dict[str, np.ndarray]) -> None:
        """Each array at the end of its key's ``<key>.bin`` (a temp name until commit)."""
        for key, array in arrays.items():
            out = self._handles.get(key) or self._handles.setdefault(key, TempFile(self.path / f"{key}.bin"))
            out.handle.write(np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes())

    def _commit(self) -> None:
        try:
            keys = self.keys or ["sequence"]
            meta = {}
            for key in keys:
                (self._handles.get(key) or TempFile(self.path / f"{key}.bin")).publish(sync_dir=False)
                offsets = self._offsets_of(key)
                meta[key] = {"shape": [offsets[-1]], "dtype": self.dtype_of(key).name, "offsets": offsets}
            fsync_dir(self.path)
            atomic_write_bytes(self.path / META_NAME, orjson.dumps(meta))
            self._seal()
            (self.path / WRITING_MARKER).unlink()
            fsync_dir(self.path)
        except BaseException:
            self._abort()
            raise

    def _offsets_of(self, key: str) -> list[int]:
        return self._offsets

    def _seal(self) -> None:
        """What a subclass writes after meta.json, before the store is published (a record store: its manifest)."""

    def _abort(self) -> None:
        for out in self._handles.values():
            out.abort()
        for entry in list(self.path.iterdir()):
            if entry.name.endswith(".bin") or entry.name.endswith(TMP_SUFFIX) or entry.name == WRITING_MARKER:
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()


class RecordStoreWriter(BinMetaStoreWriter):
    """A record store (:func:`open_records`): each key has its own record offsets.

    ``add_record({key: array})`` appends one record; keys may differ in length (a DPO pair's chosen
    and rejected sides), a token key and its mask may not. GRPO's grouped keys (``responses``,
    ``masks``) take a list of arrays, one per response, as many as the record's ``rewards``.
    """

    def __init__(self, path: str | os.PathLike[str], **options: Any) -> None:
        super().__init__(path, **options)
        self._key_offsets: dict[str, list[int]] = {}

    def add_keyed(self, arrays: Mapping[str, Any]) -> None:
        self.add_record(arrays)

    def add_record(self, arrays: Mapping[str, Any]) -> None:
        """Append one record (see the class docstring)."""
        keys = self._keys_of(arrays, "add_record")
        record = self.num_documents
        pieces: dict[str, list[np.ndarray]] = {}
        for key in keys:
            value = arrays[key]
            if key in GROUPED_KEYS:
                if not isinstance(value, (list, tuple)):
                    raise ShapeMismatchError(
                        f"{key} is one array, expected a list of arrays (one per response)",
                        path=self.path,
                        record=record,
                        field=key,
                    )
                pieces[key] = [self._checked(key, part) for part in value]
            else:
                pieces[key] = [self._checked(key, value)]
        self._check_record(pieces, record)
        for key, parts in pieces.items():
            offsets = self._key_offsets.setdefault(key, [0])
            for part in parts:
                self._write_segment({key: part})
                offsets.append(offsets[-1] + len(part))
        self.num_documents += 1
        self.num_tokens += sum(len(p) for key in keys if key in TOKEN_KEYS for p in pieces[key])

    def _check_record(self, pieces: dict[str, list[np.ndarray]], record: int) -> None:
        def lengths(key: str) -> list[int]:
            return [len(part) for part in pieces[key]]

        pairs = [("chosen", "chosen_mask"), ("rejected", "rejected_mask"), ("responses", "masks")]
        pairs += [("sequence", key) for key in ("loss_mask", "position_ids")]
        for tokens, mask in pairs:
            if tokens in pieces and mask in pieces and lengths(tokens) != lengths(mask):
                raise ShapeMismatchError(
                    f"{mask} has lengths {lengths(mask)}, {tokens} has {lengths(tokens)}",
                    path=self.path,
                    record=record,
                    field=mask,
                )
        if "rewards" in pieces:
            for key in GROUPED_KEYS & set(pieces):
                if len(pieces[key]) != len(pieces["rewards"][0]):
                    raise ShapeMismatchError(
                        f"{key} has {len(pieces[key])} responses, rewards has {len(pieces['rewards'][0])}",
                        path=self.path,
                        record=record,
                        field=key,
                    )

    def _write_segment(self, arrays: dict[str, np.ndarray]) -> None:
        self._append(arrays)  # the offsets are the record's own (add_record)

    def _offsets_of(self, key: str) -> list[int]:
        return self._key_offsets.get(key, [0])

    def _seal(self) -> None:
        write_record_manifest(self.path, vocab_size=self.vocab_size, eos_id=self.eos_id)


class RecordH5Writer(_H5Output, RecordStoreWriter):  # _H5Output's commit, RecordStoreWriter's add_record
    """A record store as one HDF5 file (AstrAI's H5 layout, :mod:`.records_h5`); ``add_record`` as
    :class:`RecordStoreWriter`."""

    format = "h5"

    def __init__(self, path: str | os.PathLike[str], **options: Any) -> None:
        StoreWriter.__init__(self, path, **options)  # a file, not the bin-meta directory
        self._open_h5()
        self._handles = {}
        self._key_offsets: dict[str, list[int]] = {}
