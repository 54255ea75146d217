"""Keyed stores (AstrAI style): several aligned 1-D arrays per sample stream, read by key.

A store holds, for each key (``sequence``, ``loss_mask``, ``chosen``, ...), a list
of segments; every key has the same segment lengths, so one global element range
``[begin, end)`` addresses the same positions in every key::

    store = open_store("train.h5")                 # or a bin + meta.json directory
    store.keys                                      # ['loss_mask', 'sequence']
    len(store)                                      # elements per key
    store.fetch(0, 2048, "sequence")                # one array
    store.fetch(0, 2048, ["sequence", "loss_mask"]) # {key: array}

Two backends: HDF5 (:mod:`.h5`) and raw ``<key>.bin`` + ``meta.json``
(:mod:`.bin_meta`). Files are opened lazily in each process and never pickled:
a store sent to a DataLoader worker reopens its files there.
"""

from __future__ import annotations

import bisect
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

import numpy as np

from tokenloom.formats._contract import Validate, as_validate
from tokenloom.formats._dataset import Shard, TokenDataset
from tokenloom.formats.errors import (
    ConfigError,
    DataError,
    FormatError,
    MissingKeyError,
    RecordError,
    ResourceLimitError,
    ShapeMismatchError,
    UnsafePathError,
)
from tokenloom.formats.io.dtypes import as_token_dtype, check_asked_dtype
from tokenloom.formats.io.index_map import iter_chunks
from tokenloom.formats.io.paths import as_path
from tokenloom.formats.io.urls import is_remote_url

if TYPE_CHECKING:
    from tokenloom.formats.remote.options import RemoteOptions

__all__ = [
    "FLOAT_KEYS",
    "KEY_DTYPES",
    "OPTIONAL_TRAIN_TYPE_KEYS",
    "WIDE_KEYS",
    "TOKEN_KEYS",
    "TRAIN_TYPE_KEYS",
    "KeyedStore",
    "check_finite",
    "check_length",
    "read_store",
    "token_key_dtype",
    "check_key_name",
    "StoreTokenReader",
    "train_type_of",
]

#: The keys each training type reads (as in AstrAI's DatasetFactory).
TRAIN_TYPE_KEYS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "seq": ("sequence",),
        "sft": ("sequence", "loss_mask"),
        "dpo": ("chosen", "rejected", "chosen_mask", "rejected_mask"),
        "grpo": ("prompts", "responses", "masks", "rewards"),
    }
)
#: Keys a training type reads when the store has them (AstrAI's SFT stores carry ``position_ids``).
OPTIONAL_TRAIN_TYPE_KEYS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"seq": ("position_ids",), "sft": ("position_ids",)}
)
#: dtypes of non-token integer keys that need more than one byte.
WIDE_KEYS = MappingProxyType({"position_ids": np.dtype("<i4")})
#: Keys that hold token ids (checked against the vocabulary when written).
TOKEN_KEYS = frozenset({"sequence", "chosen", "rejected", "prompts", "responses"})
#: Keys that hold floats (checked for NaN and infinity).
FLOAT_KEYS = frozenset({"rewards"})
#: dtypes a store may hold, by the names AstrAI writes into meta.json.
KEY_DTYPES = frozenset(
    ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64"]
)
#: Refuse a segment longer than this many elements unless asked (a length field over a cap).
DEFAULT_MAX_ELEMENTS = 1 << 40
_KEY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_CHUNK = 1 << 22


def check_key_name(key: object, *, path: Path | None = None) -> str:
    """A key that is safe as a group or file name, or UnsafePathError/ConfigError."""
    if not isinstance(key, str):
        raise ConfigError(f"key {key!r} is not a string", path=path, field="key")
    if not _KEY_NAME.fullmatch(key) or ".." in key:
        raise UnsafePathError(
            f"key {key!r} is not a plain name (letters, digits, '_', '.', '-'; no path separators)",
            path=path,
            field="key",
        )
    return key


def check_finite(values: np.ndarray, *, key: str, path: Path | None, record: int | None) -> None:
    """RecordError at the first NaN or infinity in a float array (checked in chunks)."""
    if values.dtype.kind != "f":
        return
    for start, chunk in iter_chunks(values, _CHUNK):  # a mapped file's pages are released as it goes
        bad = ~np.isfinite(chunk)
        if bad.any():
            position = start + int(np.argmax(bad))
            raise RecordError(
                f"{key} holds {chunk[position - start]} at element {position}, expected a finite number",
                path=path,
                record=record,
                field=key,
                hint="Fix or drop the samples whose rewards are NaN or infinite, then re-create the store",
            )


def check_length(length: int, max_elements: int, *, path: Path, key: str) -> None:
    """ResourceLimitError for a segment longer than ``max_elements`` (a length field over a cap)."""
    if length > max_elements:
        raise ResourceLimitError(
            f"{key} segment declares {length} elements, more than the cap of {max_elements}",
            path=path,
            field=key,
            hint="If the store is genuine, pass a larger max_elements",
        )


def token_key_dtype(store: KeyedStore, key: str, dtype: Any, *, path: str | os.PathLike[str]) -> np.dtype:
    """The token dtype of ``key`` for a TokenDataset view of ``store`` (checked against ``dtype`` if given)."""
    if key not in store.keys:
        raise MissingKeyError(
            f"key {key!r} is not in the store (it has {store.keys})",
            path=path,
            field=key,
            hint="Pass key=... or read it with open_store(path).fetch",
        )
    token_dtype = as_token_dtype(store.dtypes[key], field=key)
    check_asked_dtype(dtype, token_dtype, recorded=f"{key} is", path=path)
    return token_dtype


class StoreTokenReader:
    """The token-dataset view of a keyed store (a :class:`TokenReader`): one key's data as entries.

    ``shards(store, key, token_dtype, path)`` maps the loaded store's segments of ``key`` to shards.
    """

    def __init__(
        self, format: str, store_class: type[KeyedStore], shards: Callable[[Any, str, np.dtype, Path], list[Shard]]
    ) -> None:
        self.format = format
        self.store_class = store_class
        self.shards = shards

    def __call__(
        self,
        path: str | os.PathLike[str],
        *,
        validate: Validate = Validate.FAST,
        dtype: Any = None,
        key: str = "sequence",
        vocab_size: int | None = None,
        eos_id: int | None = None,
    ) -> TokenDataset:
        store = self.store_class(validate=validate).load(path)
        token_dtype = token_key_dtype(store, key, dtype, path=path)
        shards = self.shards(store, key, token_dtype, as_path(path))
        metadata = {"key": key, "keys": store.keys}
        dataset = TokenDataset(
            shards, format=self.format, root=path, vocab_size=vocab_size, eos_id=eos_id, metadata=metadata
        )
        return dataset.check_deep(validate)  # a store records no vocab size: vocab_size= checks ids against one


def train_type_of(keys: Sequence[str]) -> str | None:
    """The training type whose keys are exactly ``keys``, else None."""
    wanted = set(keys)
    for name, names in TRAIN_TYPE_KEYS.items():
        if set(names) == wanted:
            return name
    return None


class KeyedStore:
    """Base of the keyed stores: segment bookkeeping, ``fetch`` and pickling.

    Subclasses implement ``_load(path)`` (validate, then fill ``_segment_table``
    and ``_dtypes``) and ``_read(key, segment, start, stop)``.
    """

    format: ClassVar[str] = ""  # the store name users pass to open_store ("h5", "bin")

    def __init__(self, *, validate: Validate | str = Validate.FAST, max_elements: int = DEFAULT_MAX_ELEMENTS) -> None:
        self.validate = as_validate(validate)
        self.max_elements = max_elements
        self.path: Path | None = None
        #: how a store in object storage is read (set by ``open_store`` of a URL; None: a local store)
        self.remote: RemoteOptions | None = None
        self._keys: list[str] = []
        self._dtypes: dict[str, np.dtype] = {}
        self._segment_lengths = np.empty(0, dtype=np.int64)
        self._starts: list[int] = [0]
        self._record_offsets: np.ndarray | None = None
        self._pid: int | None = None

    # -- loading ------------------------------------------------------------------------
    def load(self, path: str | os.PathLike[str]) -> Self:
        """Validate and index the store at ``path`` (files are reopened lazily for reading)."""
        self._close()
        target = as_path(path)
        lengths, records = self._load(target)
        self.path = target
        self._segment_lengths = np.asarray(lengths, dtype=np.int64)
        self._starts = [0, *np.cumsum(self._segment_lengths).tolist()]
        self._record_offsets = records
        return self

    def _load(self, path: Path) -> tuple[list[int], np.ndarray | None]:
        raise NotImplementedError

    def _read(self, key: str, segment: int, start: int, stop: int) -> np.ndarray:
        raise NotImplementedError

    def _close(self) -> None:
        """Drop open file handles (subclasses that keep some override this)."""

    # -- the reading contract -----------------------------------------------------------
    @property
    def loaded(self) -> bool:
        return self.path is not None

    @property
    def keys(self) -> list[str]:
        """The store's keys, sorted."""
        return list(self._keys)

    @property
    def dtypes(self) -> dict[str, np.dtype]:
        return dict(self._dtypes)

    @property
    def train_type(self) -> str | None:
        """seq / sft / dpo / grpo when the keys are exactly that type's, else None."""
        return train_type_of(self._keys)

    @property
    def segment_lengths(self) -> np.ndarray:
        """Elements in each segment (the same for every key), int64."""
        return self._segment_lengths.copy()

    @property
    def record_offsets(self) -> np.ndarray:
        """Record boundaries in the element stream (``len(records) + 1`` values, int64).

        HDF5: one record per segment. bin + meta.json: the ``offsets`` AstrAI
        writes per record, else one record per meta.json directory.
        """
        if self._record_offsets is not None:
            return self._record_offsets.copy()
        return np.asarray(self._starts, dtype=np.int64)

    def __len__(self) -> int:
        return self._starts[-1]

    def require(self, train_type: str | None = None) -> None:
        """MissingKeyError listing the keys found unless the store has every key of ``train_type``."""
        if train_type is None or train_type not in TRAIN_TYPE_KEYS:
            raise ConfigError(
                f"train_type {train_type!r}, expected one of {sorted(TRAIN_TYPE_KEYS)}",
                field="train_type",
            )
        missing = [k for k in TRAIN_TYPE_KEYS[train_type] if k not in self._keys]
        if missing:
            raise MissingKeyError(
                f"train_type {train_type!r} needs keys {list(TRAIN_TYPE_KEYS[train_type])}, "
                f"missing {missing}; the store has {self._keys}",
                path=self.path,
                field=missing[0],
            )

    def fetch(self, begin: int, end: int, keys: str | Sequence[str]) -> Any:
        """Elements ``[begin, end)`` of one key (an array) or of several (a dict of arrays).

        A range inside one segment of a bin store is a zero-copy view; ranges
        spanning segments are concatenated (segments are found by bisect over
        the cumulative lengths).
        """
        if not self.loaded:
            raise DataError(
                f"the {self.format} store is not loaded",
                field="fetch",
                hint="Call store.load(path) (or use open_store(path)) before fetch",
            )
        if not 0 <= begin <= end <= len(self):
            raise IndexError(f"element range [{begin}, {end}) outside [0, {len(self)}]")
        if isinstance(keys, str):
            return self._fetch_key(self._known(keys), begin, end)
        return {key: self._fetch_key(self._known(key), begin, end) for key in keys}

    def _known(self, key: str) -> str:
        if key not in self._dtypes:
            raise MissingKeyError(f"key {key!r} is not in the store; it has {self._keys}", path=self.path, field=key)
        return key

    def _fetch_key(self, key: str, begin: int, end: int) -> np.ndarray:
        if begin == end:
            return np.empty(0, dtype=self._dtypes[key])
        starts = self._starts
        first = bisect.bisect_right(starts, begin) - 1
        last = bisect.bisect_left(starts, end) - 1
        if first == last:
            return self._read(key, first, begin - starts[first], end - starts[first])
        parts = []
        for segment in range(first, last + 1):
            lo = max(begin, starts[segment]) - starts[segment]
            hi = min(end, starts[segment + 1]) - starts[segment]
            if hi > lo:
                parts.append(self._read(key, segment, lo, hi))
        return np.concatenate(parts)

    # -- shared validation ----------------------------------------------------------------
    @staticmethod
    def _check_dtype(name: str, *, path: Path, key: str) -> np.dtype:
        if name not in KEY_DTYPES:
            raise FormatError(f"{key} has dtype {name}, expected one of {sorted(KEY_DTYPES)}", path=path, field=key)
        return np.dtype(name).newbyteorder("<")

    @staticmethod
    def _check_aligned(lengths: dict[str, list[int]], *, path: Path) -> list[int]:
        """Every key has the same segment lengths, or ShapeMismatchError naming the pair and segment."""
        keys = sorted(lengths)
        reference = keys[0]
        for key in keys[1:]:
            if len(lengths[key]) != len(lengths[reference]):
                raise ShapeMismatchError(
                    f"{key} has {len(lengths[key])} segments, {reference} has {len(lengths[reference])}",
                    path=path,
                    field=key,
                )
            for segment, (a, b) in enumerate(zip(lengths[reference], lengths[key], strict=True)):
                if a != b:
                    raise ShapeMismatchError(
                        f"segment {segment}: {key} has {b} elements, {reference} has {a}",
                        path=path,
                        record=segment,
                        field=key,
                    )
        return list(lengths[reference])

    # -- processes ------------------------------------------------------------------------
    def _handles_valid(self) -> bool:
        """False after a fork: handles opened by another process must not be reused."""
        if self._pid != os.getpid():
            self._close()
            self._pid = os.getpid()
            return False
        return True

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_pid"] = None  # the receiving process reopens files on first read
        if "_files" in state:  # an HDF5 store's open files
            state["_files"] = {}
        return state

    def __repr__(self) -> str:
        return f"{type(self).__name__}(path={self.path!r}, keys={self._keys}, elements={len(self)})"


T = TypeVar("T")


def read_store(path: str | os.PathLike[str], remote: RemoteOptions | None, read: Callable[[Any], T]) -> T:
    """``read(path)``; for a URL, ``read`` runs on its :class:`RemotePath` through the one remote layer
    (:func:`tokenloom.formats.remote.opener.read_remote`, which names the result by the URL and gives it
    ``remote`` as ``.remote``). ``remote`` with a local path is a ConfigError: it says how to reach object storage."""
    if is_remote_url(path):
        from tokenloom.formats.remote.opener import read_remote

        return read_remote(path, read, remote=remote)
    if remote is not None:
        raise ConfigError(
            f"remote= applies to a store in object storage (s3://, gs://, az://, https://), not to {os.fspath(path)!r}",
            field="remote",
            hint="Drop remote=, or pass the store's URL",
        )
    return read(path)
