"""``open_store``: detect a keyed store's backend, load and (optionally) check its training-type keys."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tokenloom.formats.errors import FormatError, MissingFileError
from tokenloom.formats.keyed.bin_meta import BinStore, find_meta_files
from tokenloom.formats.keyed.h5 import H5_SUFFIXES, H5Store, find_h5_files
from tokenloom.formats.keyed.store import KeyedStore, StoreFactory

__all__ = ["BinStore", "H5Store", "detect_store_type", "open_store"]


def detect_store_type(path: str | os.PathLike[str]) -> str:
    """``"h5"`` for .h5/.hdf5 files or directories of them, ``"bin"`` for meta.json directories."""
    target = Path(path)
    if target.is_file():
        if target.suffix in H5_SUFFIXES:
            return "h5"
        raise FormatError(f"{target.name} is not a keyed store (expected .h5/.hdf5 or a directory)", path=target)
    if not target.is_dir():
        raise MissingFileError(f"{target.name} does not exist", path=target)
    found = [name for name, hit in (("h5", find_h5_files(target)), ("bin", find_meta_files(target))) if hit]
    if len(found) == 1:
        return found[0]
    if not found:
        raise FormatError(
            "no keyed store here (tried h5: *.h5/*.hdf5 files, bin: meta.json + <key>.bin)",
            path=target,
            field="storage_type",
        )
    raise FormatError(
        "the directory holds both HDF5 files and meta.json", path=target, hint="Pass storage_type='h5' or 'bin'"
    )


def open_store(
    path: str | os.PathLike[str],
    storage_type: str | None = None,
    *,
    training_type: str | None = None,
    **options: Any,
) -> KeyedStore:
    """Load the keyed store at ``path`` (backend detected unless ``storage_type`` is given).

    ``training_type`` (seq / sft / dpo / grpo) checks that its keys are present;
    ``options`` go to the store (``validate``, ``max_elements``).
    """
    store = StoreFactory.create(storage_type or detect_store_type(path), **options)
    store.load(path)
    if training_type is not None:
        store.require(training_type)
    return store
