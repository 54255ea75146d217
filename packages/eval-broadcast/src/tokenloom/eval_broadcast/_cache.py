"""The eval-set cache: one native tokenloom dataset per content key, published by one directory rename.

The key hashes the source's data fingerprint (dataset, config, split, revision or
file hashes), the tokenizer fingerprint and every setting that changes the rows.
Each row is one entry (the last row stored padded, ``tail_padding`` in the
metadata), so the whole set is one contiguous ``(rows, row_len)`` memory map. A
cache entry whose manifest, sizes or row checksum do not verify is moved aside,
deleted and rebuilt with a warning, never used. No file locks (Lustre and VAST
break them): the writer builds in a scratch directory and renames it into place.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tokenloom.datasets import settings_fingerprint
from tokenloom.eval_broadcast._rows import DTYPE_CODES, EvalSet, rows_checksum
from tokenloom.formats import ChecksumError, DataError, FormatError, open_dataset, open_writer
from tokenloom.formats.io import MANIFEST_NAME, fsync_dir

__all__ = ["CacheWarning", "cache_entry", "open_cache", "read_cache", "write_cache"]

log = logging.getLogger("tokenloom.eval_broadcast")
CACHE_VERSION = 1
_WRITE_BLOCK_TOKENS = 1 << 24


class CacheWarning(UserWarning):
    """A cache entry could not be used and is being rebuilt."""


def cache_entry(cache_dir: str | os.PathLike[str], source_fingerprint: str, **settings: Any) -> Path:
    """The directory that holds (or will hold) the set for this source and these settings."""
    key = settings_fingerprint(cache_version=CACHE_VERSION, source=source_fingerprint, **settings)
    return Path(cache_dir) / f"eval-{key}"


def read_cache(path: Path) -> EvalSet | None:
    """The cached set, memory-mapped and checksum-verified; None when absent or unusable (then removed)."""
    if not (path / MANIFEST_NAME).exists():
        if path.exists():
            _discard(path, "it has no manifest (an interrupted copy?)")
        return None
    try:
        return open_cache(path)
    except (DataError, OSError, KeyError, TypeError, ValueError) as exc:
        _discard(path, str(exc))
        return None


def open_cache(path: Path) -> EvalSet:
    """The cached set at ``path``, memory-mapped; DataError when anything fails to verify."""
    dataset = open_dataset(path, format="native", validate="fast")
    meta = dataset.metadata
    rows, row_len, tail_padding = int(meta["rows"]), int(meta["row_len"]), int(meta["tail_padding"])
    if DTYPE_CODES.get(dataset.dtype.name) is None:
        raise FormatError(f"cache dtype {dataset.dtype.name} is not a wire dtype", path=path, field="dtype")
    if dataset.num_tokens != rows * row_len or dataset.num_shards != 1:
        raise FormatError(
            f"cache holds {dataset.num_tokens} tokens in {dataset.num_shards} shard(s), "
            f"expected {rows} x {row_len} in one",
            path=path,
        )
    shard = dataset.shards[0]
    if rows == 0:
        array = np.empty((0, row_len), dtype=dataset.dtype)
    else:  # copy-on-write: writable for torch, the file is never modified
        array = np.memmap(
            shard.tokens_path, dtype=dataset.dtype, mode="c", offset=shard.tokens_offset, shape=(rows, row_len)
        )
    expected = int(meta["checksum"])
    found = rows_checksum(array)
    if found != expected:
        raise ChecksumError(f"rows checksum {found:016x}, the cache recorded {expected:016x}", path=shard.tokens_path)
    return EvalSet(
        rows=torch.from_numpy(array),
        tail_padding=tail_padding,
        eos_id=dataset.eos_id,
        vocab_size=dataset.vocab_size,
        origin="cache",
        cache_path=str(path),
    )


def write_cache(path: Path, evalset: EvalSet, settings: dict[str, Any]) -> None:
    """Publish ``evalset`` at ``path`` atomically (scratch directory, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    rows = evalset.numpy()
    metadata = {
        **settings,
        "rows": len(evalset),
        "row_len": evalset.row_len,
        "tail_padding": evalset.tail_padding,
        "checksum": rows_checksum(rows),
    }
    try:
        with open_writer(
            scratch,
            format="native",
            dtype=rows.dtype,
            vocab_size=evalset.vocab_size,
            eos_id=evalset.eos_id,
            metadata=metadata,
            overwrite=True,
        ) as writer:
            block = max(1, _WRITE_BLOCK_TOKENS // max(1, evalset.row_len))
            for begin in range(0, len(rows), block):
                part = rows[begin : begin + block]
                writer.add_batch(part.reshape(-1), np.full(len(part), evalset.row_len, dtype=np.int64))
        try:
            os.replace(scratch, path)
        except OSError:  # published meanwhile by another process: identical content by construction
            if not (path / MANIFEST_NAME).exists():
                raise
        fsync_dir(path.parent)
        log.info("cached the eval set (%d rows of %d) in %s", len(evalset), evalset.row_len, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(scratch)


def _discard(path: Path, reason: str) -> None:
    warnings.warn(f"eval cache {path} is unusable ({reason}); rebuilding it", CacheWarning, stacklevel=3)
    log.warning("eval cache %s is unusable (%s); rebuilding it", path, reason)
    aside = path.with_name(f".{path.name}-corrupt-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        os.replace(path, aside)
        shutil.rmtree(aside)
