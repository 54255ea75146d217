"""Keyed stores: HDF5 (``.h5``), ``<key>.bin`` + ``meta.json``, and grouped records.

``store.py`` holds what every keyed store shares (keys per training type, ``fetch``), ``h5.py`` and
``bin_meta.py`` each store's layout doc, detector and readers, ``writers.py`` their writers and
``records.py`` the grouped record layout. Both stores also open as token datasets (their
``sequence`` key), so they register as formats with a store side.
"""

import re
from pathlib import Path

from tokenloom.formats._contract import FormatSpec, StoreSpec
from tokenloom.formats.keyed.bin_meta import META_NAME, BinStore, find_meta_files, is_bin_store, open_bin_meta_dataset
from tokenloom.formats.keyed.h5 import H5_SUFFIXES, H5Store, is_h5_store, open_h5_dataset
from tokenloom.formats.keyed.records import GROUPED_KEYS, RecordStore, open_records
from tokenloom.formats.keyed.records_h5 import is_h5_record_path
from tokenloom.formats.keyed.store import OPTIONAL_TRAIN_TYPE_KEYS, TRAIN_TYPE_KEYS, KeyedStore
from tokenloom.formats.keyed.writers import (
    BinMetaStoreWriter,
    H5StoreWriter,
    RecordH5Writer,
    RecordStoreWriter,
    StoreWriter,
)

__all__ = [
    "GROUPED_KEYS",
    "H5_SPEC",
    "BIN_META_SPEC",
    "OPTIONAL_TRAIN_TYPE_KEYS",
    "RECORD_FORMATS",
    "TRAIN_TYPE_KEYS",
    "BinMetaStoreWriter",
    "BinStore",
    "H5Store",
    "H5StoreWriter",
    "KeyedStore",
    "RecordStore",
    "RecordH5Writer",
    "RecordStoreWriter",
    "StoreWriter",
    "open_records",
]


def _holds_bin_meta(path: Path) -> bool:
    return path.is_dir() and bool(find_meta_files(path))


#: What the token-dataset view of either store takes (``key``: which key holds the tokens).
OPTIONS = ("key", "vocab_size", "eos_id")
H5_DESCRIPTION = "HDF5 keyed store (AstrAI): a group per key; its 'sequence' key as tokens"
BIN_META_DESCRIPTION = "<key>.bin + meta.json keyed store (AstrAI); its 'sequence' key as tokens"
H5_STORE = StoreSpec("h5", store=H5Store, detect=is_h5_record_path, looks_like="*.h5/*.hdf5 files")
BIN_META_STORE = StoreSpec("bin", store=BinStore, detect=_holds_bin_meta, looks_like="meta.json + <key>.bin")

H5_SPEC = FormatSpec(
    "h5",
    H5_DESCRIPTION,
    is_h5_store,
    open_h5_dataset,
    H5StoreWriter,
    OPTIONS,
    store=H5_STORE,
    suffixes=H5_SUFFIXES,
    targets=lambda target: [target],  # one file, published by a rename
    output_name="data.h5",
)
BIN_META_SPEC = FormatSpec(
    "bin-meta",
    BIN_META_DESCRIPTION,
    is_bin_store,
    open_bin_meta_dataset,
    BinMetaStoreWriter,
    OPTIONS,
    store=BIN_META_STORE,
    suffixes=(".bin",),
    targets=lambda target: [target, target / META_NAME],
    file_names=rf"[\w.-]+\.bin|{re.escape(META_NAME)}",
)
#: The format names a grouped record store (``open_records``) opens under: the bin store's and its spec's.
RECORD_FORMATS = (BIN_META_STORE.name, BIN_META_SPEC.name)
