"""tokenloom.formats: token data on disk, read and written safely.

    raw shards (native .bin/.idx, flat .npy/.bin, Megatron, Modalities .pbin, keyed stores)
        -> open_dataset(path) -> TokenDataset (zero-copy views over memory maps)

One folder per format (``native/``, ``flat/``, ``megatron/``, ``packed/``, ``keyed/``), each with
its reader, writer, byte layout and detector, registering its own :class:`FormatSpec`; a third
party's format plugs in through the ``tokenloom.formats`` entry-point group. Plumbing that sibling
packages share (atomic writes, locks, path safety, storage errors) lives in
:mod:`tokenloom.formats.io`, the ``tokenloom`` command in :mod:`tokenloom.formats.cli`, the error
hierarchy in :mod:`tokenloom.formats.errors`. Importing this package imports neither click nor rich.
"""

from typing import TYPE_CHECKING

from tokenloom.formats import errors
from tokenloom.formats._buckets import open_buckets
from tokenloom.formats._contract import FormatSpec, StoreSpec, TokenReader, Validate, WriterFactory
from tokenloom.formats._convert import ConvertResult, convert_dataset
from tokenloom.formats._dataset import Shard, TokenDataset
from tokenloom.formats._registry import (
    available_formats,
    detect_format,
    open_dataset,
    open_writer,
    register_format,
    writable_formats,
)
from tokenloom.formats._writer import TokenWriter
from tokenloom.formats.errors import *  # noqa: F403  # pyright: ignore[reportWildcardImportFromLibrary] - listed once, in errors.__all__
from tokenloom.formats.io.manifest import Manifest, read_manifest
from tokenloom.formats.io.progress import ProgressCallback

if TYPE_CHECKING:
    from tokenloom.formats.remote.options import RemoteOptions

# the built-in formats register themselves on import
from tokenloom.formats import flat, keyed, megatron, native, packed  # noqa: F401  # isort: skip
from tokenloom.formats.keyed import (
    OPTIONAL_TRAIN_TYPE_KEYS,
    TRAIN_TYPE_KEYS,
    KeyedStore,
    RecordStore,
    RecordStoreWriter,
    detect_store_type,
    open_records,
    open_store,
)

__all__ = [
    "OPTIONAL_TRAIN_TYPE_KEYS",
    "TRAIN_TYPE_KEYS",
    "ConvertResult",
    "FormatSpec",
    "KeyedStore",
    "Manifest",
    "ProgressCallback",
    "RecordStore",
    "RemoteOptions",
    "RecordStoreWriter",
    "Shard",
    "StoreSpec",
    "TokenDataset",
    "TokenReader",
    "TokenWriter",
    "Validate",
    "WriterFactory",
    "available_formats",
    "convert_dataset",
    "detect_format",
    "detect_store_type",
    "open_buckets",
    "open_dataset",
    "open_records",
    "open_store",
    "open_writer",
    "read_manifest",
    "register_format",
    "writable_formats",
]
__all__ += errors.__all__


def __getattr__(name: str) -> object:
    if name == "RemoteOptions":  # imported on first use: the remote layer is not needed to read local data
        from tokenloom.formats.remote.options import RemoteOptions

        return RemoteOptions
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
