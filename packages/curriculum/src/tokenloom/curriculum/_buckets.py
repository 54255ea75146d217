"""Buckets: ``path/train/<bucket>/`` token shards opened into wave-1 datasets, and their inventory.

The budget units are defined here, once (``budget_unit`` in the config):

- ``input_tokens`` (default): **the non-padding tokens of an emitted sample's
  input_ids** (loss-masked positions count, padding does not). Fixed windows: L
  per sample. Bin-packed sequences: the sum of the item lengths of the sequence
  (from the packing plan).
- ``loss_tokens``: GPT-Simple's count (``(labels != -100).sum()`` in its
  ``_train_loop.py``, over its unshifted labels): of the n non-padding input
  tokens, those that are neither the first token after an EOS (position p >= 1
  with input_ids[p - 1] == EOS) nor inside an entry's overlap prefix. Computed
  once per sample when the bucket is opened (one pass over its tokens).

Validation, the schedule, the runtime counters and the budget-mismatch check all
use :func:`sample_budget_tokens`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokenloom.curriculum._config import BudgetUnit
from tokenloom.curriculum._errors import BucketMismatchError, EmptyBucketError, MissingValTwinError
from tokenloom.curriculum._remote_dir import RemoteDir
from tokenloom.curriculum._sft_bucket import SFTBucket, is_sft_store, refuse_other_records
from tokenloom.datasets import PackedIndex, WindowIndex, data_fingerprint
from tokenloom.formats import ConfigError, DataError, MissingFileError, TokenDataset, open_dataset

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
    path: Path | RemoteDir
    dataset: Any
    """MemoryMappedDataset (windows) or PackedDocumentDataset (packing); pickles without entry indexes.
    Opened without samples: their torch-free WindowIndex / PackedIndex (same sizes and fingerprint)."""
    samples: int
    budget_tokens: int
    """Budget tokens over one epoch (see the module docstring)."""
    per_sample: np.ndarray | int
    """Budget tokens of every sample (an int when constant), in the config's unit."""
    fingerprint: str
    entries: int
    """Index entries of the token data (a document windowed into pieces is several entries)."""
    shards: int
    disk_tokens: int
    eos_id: int | None


def discover_buckets(root: Path | RemoteDir, *, source: str | None = None) -> list[str]:
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


def is_empty_dir(directory: Path | RemoteDir) -> bool:
    """A directory holding nothing but hidden entries (no token data to open)."""
    return not any(p for p in directory.iterdir() if not p.name.startswith("."))


def check_val_twin(root: Path | RemoteDir, bucket: str) -> None:
    """``val/<bucket>`` exists and is not empty (cheap: nothing is opened)."""
    _check_twin(root / "val" / bucket, bucket, "val")


def _check_twin(directory: Path | RemoteDir, bucket: str, split: str) -> None:
    if not directory.is_dir():
        raise MissingValTwinError(
            f"bucket {bucket!r} has no {split}/ twin: {directory} is missing",
            path=directory,
            hint=f"Tokenize the {split} split of {bucket!r} into {directory}, as GPT-Simple requires",
        )
    if is_empty_dir(directory):
        raise EmptyBucketError(
            f"bucket directory {directory} ({split}/{bucket}) is empty",
            path=directory,
            hint="Tokenize data into it or remove the directory",
        )


def _open_tokens(directory: Path | RemoteDir, bucket: str, split: str) -> TokenDataset:
    _check_twin(directory, bucket, split)
    # a bucket in object storage opens with the root's store options and node-local cache
    data = open_dataset(str(directory), remote=getattr(directory, "remote", None))
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


def sample_budget_tokens(
    dataset: Any, unit: BudgetUnit | str = BudgetUnit.INPUT_TOKENS, *, eos_id: int | None = None
) -> np.ndarray | int:
    """Budget tokens of every sample of a bucket dataset: an int (constant) or one per sample.

    ``unit`` ``loss_tokens`` needs the EOS id (default: the dataset's) and reads every token once.
    """
    if isinstance(dataset, SFTBucket):  # conversation tokens or trained labels per packed sample
        return dataset.budget(unit)
    if BudgetUnit(unit) is BudgetUnit.LOSS_TOKENS:
        return sample_loss_tokens(dataset, eos_id=eos_id)
    if isinstance(dataset, PackedIndex):
        plan = dataset.plan
        lengths = np.asarray(plan.length, dtype=np.int64)
        offsets = np.asarray(plan.bin_offsets, dtype=np.int64)
        return np.add.reduceat(lengths, offsets[:-1]) if len(lengths) else np.zeros(0, np.int64)
    return int(dataset.seq_len)


def loss_tokens(content: np.ndarray, eos_id: int, prefix: np.ndarray | None = None) -> np.ndarray:
    """GPT-Simple's loss tokens of rows of non-padding input tokens (2-D, one sample per row).

    A position counts unless it follows an EOS (p >= 1, content[p - 1] == EOS) or ``prefix`` marks it.
    """
    masked = np.zeros(content.shape, dtype=bool)
    masked[:, 1:] = content[:, :-1] == eos_id
    if prefix is not None:
        masked |= prefix
    return content.shape[1] - masked.sum(axis=1, dtype=np.int64)


_CHUNK = 4096


def sample_loss_tokens(dataset: Any, *, eos_id: int | None = None) -> np.ndarray:
    """GPT-Simple's loss tokens of every sample of a bucket dataset (see the module docstring)."""
    data: TokenDataset = dataset.dataset
    eos = eos_id if eos_id is not None else data.eos_id
    if eos is None:
        raise ConfigError(
            "budget_unit loss_tokens needs the EOS id, and neither this bucket's data nor the config declares one",
            path=getattr(data, "path", None),
            field="eos_id",
            hint="Add eos_id: ID to the data block of the curriculum config (GPT-Simple takes it from its tokenizer; "
            "a local tokenizer directory as `tokenizer:` is read for it), or write it into the bucket's manifest "
            "(tokenloom validate --write-manifest --eos-id ID), or use budget_unit: input_tokens",
        )
    out = np.empty(len(dataset), dtype=np.int64)
    if isinstance(dataset, PackedIndex):
        plan = dataset.plan
        offsets = np.asarray(plan.bin_offsets, dtype=np.int64)
        for index in range(len(dataset)):
            first, last = int(offsets[index]), int(offsets[index + 1])
            pieces, prefix = [], []
            for item in range(first, last):
                start, length = int(plan.token_start[item]), int(plan.length[item])
                pieces.append(np.asarray(data.tokens(start, start + length)))
                flags = np.zeros(length, dtype=bool)
                flags[: int(plan.prefix[item])] = True
                prefix.append(flags)
            content = np.concatenate(pieces)[None, :]
            out[index] = loss_tokens(content, eos, np.concatenate(prefix)[None, :])[0]
        return out
    length = int(dataset.seq_len)
    for begin in range(0, len(dataset), _CHUNK):
        rows = range(begin, min(begin + _CHUNK, len(dataset)))
        content = np.stack([np.asarray(dataset.window(i)[:length]) for i in rows])
        starts = np.asarray([dataset.window_start(i) for i in rows], dtype=np.int64)
        out[begin : begin + len(rows)] = loss_tokens(content, eos, dataset.overlap_mask(starts, length))
    return out


def open_bucket(
    root: Path | RemoteDir,
    name: str,
    *,
    seq_len: int,
    packing: bool,
    split: str = "train",
    plan_cache_dir: str | os.PathLike[str] | None = None,
    options: dict[str, Any] | None = None,
    unit: BudgetUnit | str = BudgetUnit.INPUT_TOKENS,
    index_only: bool = False,
    eos_id: int | None = None,
) -> Bucket:
    """Open ``root/split/name`` as a wave-1 dataset and count its budget.

    ``index_only=True`` opens the dataset's torch-free index instead (WindowIndex / PackedIndex: the same
    checks, sizes, budget and fingerprint, no sample building): what a plan needs.
    """
    directory = root / split / name
    try:
        data = _open_tokens(directory, name, split)
    except DataError:
        refuse_other_records(directory, name)  # a dpo/grpo store: named as such, not as a broken token store
        raise
    windows: Any = WindowIndex
    packed: Any = PackedIndex
    if not index_only:  # the wave-1 datasets import torch: only a dataset that serves samples asks for them
        from tokenloom.datasets import MemoryMappedDataset as windows
        from tokenloom.datasets import PackedDocumentDataset as packed
    try:
        if is_sft_store(data):  # an sft record store: its conversations packed whole, masked (_sft_bucket)
            dataset: Any = SFTBucket(directory, name, data, seq_len, packing=packing)
        elif packing:
            dataset = packed(data, seq_len, plan_cache_dir=plan_cache_dir, **(options or {}))
        else:
            dataset = windows(data, seq_len, **(options or {}))
    except TypeError as exc:
        raise ConfigError(f"bucket options {sorted(options or {})}: {exc}", field="bucket_options") from None
    if eos_id is not None and data.eos_id is not None and eos_id != data.eos_id:
        raise BucketMismatchError(
            f"the config's eos_id {eos_id} differs from the EOS id {data.eos_id} bucket {name!r} declares",
            path=getattr(data, "path", None),
            field="eos_id",
            hint="Drop eos_id from the config (the data's own id is used) or fix it to match the tokenizer",
        )
    dtype = getattr(data, "dtype", None)
    if eos_id is not None and dtype is not None and dtype.kind in "ui" and eos_id > np.iinfo(dtype).max:
        raise ConfigError(  # it could never match: every token would count as a loss token, silently
            f"the config's eos_id {eos_id} cannot occur in bucket {name!r}: its tokens are {dtype.name}",
            path=getattr(data, "path", None),
            field="eos_id",
            hint="Use the EOS id of the tokenizer that wrote this data (its vocabulary fits the token type)",
        )
    per_sample = sample_budget_tokens(dataset, unit, eos_id=eos_id)
    samples = len(dataset)
    budget = int(per_sample) * samples if isinstance(per_sample, int) else int(per_sample.sum())
    fingerprint = str(dataset.fingerprint()) if hasattr(dataset, "fingerprint") else data_fingerprint(data)
    return Bucket(
        name=name,
        path=directory,
        dataset=dataset,
        samples=samples,
        budget_tokens=budget,
        per_sample=per_sample,
        fingerprint=fingerprint,
        entries=len(data),
        shards=len(data.shards),
        disk_tokens=int(data.num_tokens),
        eos_id=data.eos_id if data.eos_id is not None else eos_id,
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
