"""tokenloom.formats: token data on disk, read and written safely.

    raw shards (native .bin/.idx, flat .npy/.bin, Megatron, Modalities .pbin, keyed stores)
        -> open_dataset(path) -> TokenDataset (zero-copy views over memory maps)

One folder per format (``native/``, ``flat/``, ``megatron/``, ``packed/``, ``keyed/``), each with
its reader, writer, byte layout and detector, defining its own :class:`FormatSpec` (imported by the
registry when that format is first asked for); a third party's format plugs in through the
``tokenloom.formats`` entry-point group. Plumbing that sibling packages share (atomic writes, locks,
path safety, storage errors) lives in :mod:`tokenloom.formats.io`, the ``tokenloom`` command in
:mod:`tokenloom.formats.cli`, the error hierarchy in :mod:`tokenloom.formats.errors`. Importing this
package imports neither click nor rich.
"""

from typing import TYPE_CHECKING

from tokenloom.formats import errors
from tokenloom.formats._contract import FormatSpec, StoreSpec, TokenReader, Validate, WriterFactory
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
from tokenloom.formats.io.lazy import lazy_exports
from tokenloom.formats.io.manifest import Manifest, read_manifest
from tokenloom.formats.io.progress import ProgressCallback

if TYPE_CHECKING:
    from tokenloom.formats._buckets import open_buckets
    from tokenloom.formats._convert import ConvertResult, convert_dataset
    from tokenloom.formats._stores import StoreFactory, detect_store_type, open_store
    from tokenloom.formats.keyed import (
        OPTIONAL_TRAIN_TYPE_KEYS,
        TRAIN_TYPE_KEYS,
        KeyedStore,
        RecordStore,
        RecordStoreWriter,
        open_records,
    )
    from tokenloom.formats.remote.options import RemoteOptions

#: imported on first use: a plain native run needs neither the keyed stores, nor convert, nor the remote layer
#: (the format folders themselves are imported by the registry when a format is first asked for)
_KEYED = "tokenloom.formats.keyed"
_EXPORTS = {
    "ConvertResult": "tokenloom.formats._convert",
    "convert_dataset": "tokenloom.formats._convert",
    "open_buckets": "tokenloom.formats._buckets",
    **dict.fromkeys(["StoreFactory", "detect_store_type", "open_store"], "tokenloom.formats._stores"),
    "RemoteOptions": "tokenloom.formats.remote.options",
    **dict.fromkeys(
        [
            "OPTIONAL_TRAIN_TYPE_KEYS",
            "TRAIN_TYPE_KEYS",
            "KeyedStore",
            "RecordStore",
            "RecordStoreWriter",
            "open_records",
        ],
        _KEYED,
    ),
    # the format folders and the remote layer as attributes, as when this package imported them all
    **{sub: f"tokenloom.formats.{sub}" for sub in ("native", "flat", "megatron", "packed", "keyed", "remote")},
}

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
    "StoreFactory",
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
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)
