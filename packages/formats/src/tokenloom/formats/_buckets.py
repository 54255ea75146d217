"""GPT-Simple's data directory: ``<root>/train/<bucket>/*.bin|*.idx`` (and ``val/<bucket>/``).

``open_buckets(root)`` opens every bucket of a split as its own dataset, by
sorted bucket name (GPT-Simple's bucket ids are the sorted names' positions).
A bucket is any directory ``open_dataset`` reads; GPT-Simple's have no manifest
and open with fast structural validation (see ``_native``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tokenloom.formats._contract import Validate
from tokenloom.formats._dataset import TokenDataset
from tokenloom.formats._registry import open_dataset
from tokenloom.formats.errors import FormatError, MissingFileError

__all__ = ["bucket_dirs", "open_buckets"]


def bucket_dirs(root: str | os.PathLike[str], *, split: str = "train") -> dict[str, Path]:
    """``{bucket name: directory}`` of ``root/split/`` (or of ``root`` itself when it has no ``split``)."""
    base = Path(root)
    if not base.is_dir():
        raise MissingFileError(f"{base} is not a directory", path=base)
    if (base / split).is_dir():
        base = base / split
    buckets = {p.name: p for p in sorted(base.iterdir()) if p.is_dir() and not p.name.startswith(".")}
    if not buckets:
        raise FormatError(
            f"no bucket directories in {base}",
            path=base,
            hint=f"GPT-Simple's layout is DATA/{split}/<bucket>/*.bin + *.idx",
        )
    for name, directory in buckets.items():
        if not any(p.is_file() for p in directory.iterdir()):
            raise FormatError(f"bucket {name!r} is empty", path=directory, hint="Remove it or tokenize into it")
    return buckets


def open_buckets(
    root: str | os.PathLike[str], *, split: str = "train", validate: Validate = Validate.FAST, **options: Any
) -> dict[str, TokenDataset]:
    """Every bucket of ``root/split/`` opened with ``open_dataset``, by sorted name."""
    return {
        name: open_dataset(directory, validate=validate, **options)
        for name, directory in bucket_dirs(root, split=split).items()
    }
