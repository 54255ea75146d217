"""Buckets: ``path/train/<bucket>/`` token shards opened into wave-1 datasets, and their inventory.

The budget unit is defined here, once: **the non-padding tokens of an emitted
sample's input_ids** (loss-masked positions count, padding does not). Fixed
windows: L per sample. Bin-packed sequences: the sum of the item lengths of the
sequence (from the packing plan). Validation, the schedule, the runtime counters
and the budget-mismatch check all use :func:`sample_budget_tokens`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokenloom.curriculum._errors import BucketMismatchError, EmptyBucketError, MissingValTwinError
from tokenloom.datasets import MemoryMappedDataset, PackedDocumentDataset, data_fingerprint
from tokenloom.formats import ConfigError, MissingFileError, TokenDataset, open_dataset

__all__ = [
    "Bucket",
    "check_eos",
    "check_val_twin",
    "discover_buckets",
    "is_empty_dir",
    "open_bucket",
    "sample_budget_tokens",
]


@dataclass(slots=True)
class Bucket:
    """One bucket: its token data, the wave-1 dataset serving it, and its inventory."""

    name: str
    path: Path
    dataset: Any
    """MemoryMappedDataset (windows) or PackedDocumentDataset (packing); pickles without entry indexes."""
    samples: int
    budget_tokens: int
    """Budget tokens over one epoch (see the module docstring)."""
    fingerprint: str
    entries: int
    """Index entries of the token data (a document windowed into pieces is several entries)."""
    shards: int
    disk_tokens: int
    eos_id: int | None


def discover_buckets(root: Path, *, source: str | None = None) -> list[str]:
    """Sorted bucket names under ``root/train`` (GPT-Simple's layout)."""
    train = root / "train"
    if not root.is_dir():
        raise MissingFileError(f"data.path {root} does not exist", path=source, field="path")
    if not train.is_dir():
        raise MissingFileError(
            f"{root} has no train/ directory",
            path=root,
            field="path",
            hint="Lay buckets out as PATH/train/<bucket>/ and PATH/val/<bucket>/ (GPT-Simple's layout)",
        )
    names = sorted(p.name for p in train.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not names:
        raise EmptyBucketError(f"{train} holds no bucket directories", path=train)
    return names


def is_empty_dir(directory: Path) -> bool:
    """A directory holding nothing but hidden entries (no token data to open)."""
    return not any(p for p in directory.iterdir() if not p.name.startswith("."))


def check_val_twin(root: Path, bucket: str) -> None:
    """``val/<bucket>`` exists and is not empty (cheap: nothing is opened)."""
    directory = root / "val" / bucket
    if not directory.is_dir():
        raise MissingValTwinError(
            f"bucket {bucket!r} has no val/ twin: {directory} is missing",
            path=directory,
            hint=f"Tokenize the val split of {bucket!r} into {directory}, as GPT-Simple requires",
        )
    if not any(p for p in directory.iterdir() if not p.name.startswith(".")):
        raise EmptyBucketError(f"bucket directory {directory} (val/{bucket}) is empty", path=directory)


def _open_tokens(directory: Path, bucket: str, split: str) -> TokenDataset:
    if not directory.is_dir():
        raise MissingValTwinError(
            f"bucket {bucket!r} has no {split}/ twin: {directory} is missing",
            path=directory,
            hint=f"Tokenize the {split} split of {bucket!r} into {directory}, as GPT-Simple requires",
        )
    if not any(p for p in directory.iterdir() if not p.name.startswith(".")):
        raise EmptyBucketError(
            f"bucket directory {directory} ({split}/{bucket}) is empty",
            path=directory,
            hint="Tokenize data into it or remove the directory",
        )
    data = open_dataset(directory)
    if data.num_tokens == 0:
        raise EmptyBucketError(f"bucket {split}/{bucket} holds no tokens", path=directory)
    dtypes = sorted({shard.dtype.name for shard in data.shards})
    if len(dtypes) > 1:
        raise BucketMismatchError(
            f"shards of bucket {split}/{bucket} have different dtypes {dtypes}",
            path=directory,
            field="dtype",
            hint="Re-tokenize the bucket with one dtype (tokenloom convert can rewrite shards)",
        )
    return data


def sample_budget_tokens(dataset: Any) -> np.ndarray | int:
    """Budget tokens of every sample of a bucket dataset: an int (constant) or one per sample."""
    if isinstance(dataset, PackedDocumentDataset):
        plan = dataset.plan
        lengths = np.asarray(plan.length, dtype=np.int64)
        offsets = np.asarray(plan.bin_offsets, dtype=np.int64)
        return np.add.reduceat(lengths, offsets[:-1]) if len(lengths) else np.zeros(0, np.int64)
    return int(dataset.seq_len)


def open_bucket(
    root: Path,
    name: str,
    *,
    max_length: int,
    packing: bool,
    split: str = "train",
    cache_dir: str | os.PathLike[str] | None = None,
    options: dict[str, Any] | None = None,
) -> Bucket:
    """Open ``root/split/name`` as a wave-1 dataset and count its budget."""
    directory = root / split / name
    data = _open_tokens(directory, name, split)
    try:
        if packing:
            dataset: Any = PackedDocumentDataset(data, max_length, cache_dir=cache_dir, **(options or {}))
        else:
            dataset = MemoryMappedDataset(data, max_length, **(options or {}))
    except TypeError as exc:
        raise ConfigError(f"bucket options {sorted(options or {})}: {exc}", field="bucket_options") from None
    per_sample = sample_budget_tokens(dataset)
    samples = len(dataset)
    budget = int(per_sample) * samples if isinstance(per_sample, int) else int(per_sample.sum())
    fingerprint = str(dataset.fingerprint()) if hasattr(dataset, "fingerprint") else data_fingerprint(data)
    return Bucket(
        name=name,
        path=directory,
        dataset=dataset,
        samples=samples,
        budget_tokens=budget,
        fingerprint=fingerprint,
        entries=len(data),
        shards=len(data.shards),
        disk_tokens=int(data.num_tokens),
        eos_id=data.eos_id,
    )


def check_eos(buckets: list[Bucket]) -> None:
    """Buckets that declare EOS ids must agree (packing and masks depend on it)."""
    declared = {b.name: b.eos_id for b in buckets if b.eos_id is not None}
    if len(set(declared.values())) > 1:
        raise BucketMismatchError(
            f"buckets declare different EOS ids: {declared}",
            field="eos_id",
            hint="Tokenize every bucket with the same tokenizer",
        )
