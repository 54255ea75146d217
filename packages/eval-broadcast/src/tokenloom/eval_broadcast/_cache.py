"""The eval-set cache: one native tokenloom dataset per content key, published by one directory rename.

The key hashes the source's data fingerprint (dataset, config, split, revision or
file hashes), the tokenizer fingerprint and every setting that changes the rows.
Each row is one entry (the last row stored padded, ``tail_padding`` in the
metadata), so the whole set is one contiguous ``(rows, row_len)`` memory map. A
cache entry whose manifest, sizes or row checksum do not verify is moved aside,
deleted and rebuilt with a warning, never used. No file locks (Lustre and VAST
break them): the writer builds in a scratch directory and renames it into place.

A writer killed mid-write (SIGKILL, OOM) leaves its scratch directory
(``.eval-<key>-build-*``); every later call with the same ``cache_dir`` removes the
scratch directories whose owner is gone. The owner is recorded inside
(``owner.json``: host, pid, process start time; the set is written to ``data/`` beside it,
which is what the rename publishes) the moment the directory exists, as
tokenloom.formats' writer lock does: a directory is stale when its owner ran on this
host and that pid no longer runs (or runs another process), or when its record is
unreadable and the directory has not changed for a grace period. A scratch
directory of another host is never guessed at (kept, logged): its builder may be
running.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import socket
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokenloom.datasets import settings_fingerprint
from tokenloom.eval_broadcast._rows import DTYPE_CODES, EvalSet, rows_checksum
from tokenloom.formats import ChecksumError, DataError, FormatError, open_dataset, open_writer
from tokenloom.formats.io import MANIFEST_NAME, fsync_dir, holder_gone, holder_record

__all__ = [
    "CacheWarning",
    "CachedRows",
    "cache_entry",
    "cache_settings",
    "open_cache",
    "read_cache",
    "remove_stale_scratch",
    "verify_cache",
    "write_cache",
]

log = logging.getLogger("tokenloom.eval_broadcast")
CACHE_VERSION = 1
_WRITE_BLOCK_TOKENS = 1 << 24
OWNER_NAME = "owner.json"
#: A scratch directory without a readable owner record (its writer died between mkdtemp and the record, or
#: it was written before records existed) is stale once nothing in it has changed for this long.
UNOWNED_GRACE_SECONDS = 3600.0
_SCRATCH = re.compile(r"^\.eval-[0-9a-f]+-(build-|corrupt-|stale-)?")
_LIVE: set[Path] = set()  # scratch directories this process is writing now (threads)


class CacheWarning(UserWarning):
    """A cache entry could not be used and is being rebuilt."""


def cache_settings(
    *, seq_len: int | None, vocab_size: int | None, eos_id: int | None, drop_remainder: bool
) -> dict[str, Any]:
    """The build settings that key a cache entry (beside the source's fingerprint)."""
    return {"seq_len": seq_len, "vocab_size": vocab_size, "eos_id": eos_id, "drop_remainder": drop_remainder}


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


@dataclass(frozen=True, slots=True)
class CachedRows:
    """A verified cache entry as numpy: what :func:`open_cache` wraps in an EvalSet (no torch needed)."""

    rows: np.ndarray
    tail_padding: int
    eos_id: int | None
    vocab_size: int | None
    path: Path

    @property
    def num_tokens(self) -> int:
        return int(self.rows.size) - self.tail_padding


def verify_cache(path: Path) -> CachedRows:
    """The cached rows at ``path``, memory-mapped and checksum-verified; DataError when anything fails to verify."""
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
    return CachedRows(array, tail_padding, dataset.eos_id, dataset.vocab_size, path)


def open_cache(path: Path) -> EvalSet:
    """The cached set at ``path``, memory-mapped; DataError when anything fails to verify."""
    import torch

    cached = verify_cache(path)
    return EvalSet(
        rows=torch.from_numpy(cached.rows),
        tail_padding=cached.tail_padding,
        eos_id=cached.eos_id,
        vocab_size=cached.vocab_size,
        origin="cache",
        cache_path=str(path),
    )


def write_cache(path: Path, evalset: EvalSet, settings: dict[str, Any]) -> None:
    """Publish ``evalset`` at ``path`` atomically (scratch directory, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_scratch(path.parent)
    scratch = Path(tempfile.mkdtemp(prefix=f".{path.name}-build-", dir=path.parent))
    _LIVE.add(scratch)
    rows = evalset.numpy()
    metadata = {
        **settings,
        "rows": len(evalset),
        "row_len": evalset.row_len,
        "tail_padding": evalset.tail_padding,
        "checksum": rows_checksum(rows),
    }
    try:
        (scratch / OWNER_NAME).write_text(json.dumps(holder_record()))
        with open_writer(
            scratch / "data",
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
            os.replace(scratch / "data", path)
        except OSError:  # published meanwhile by another process: identical content by construction
            if not (path / MANIFEST_NAME).exists():
                raise
        fsync_dir(path.parent)
        log.info("cached the eval set (%d rows of %d) in %s", len(evalset), evalset.row_len, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(scratch)
        _LIVE.discard(scratch)


def remove_stale_scratch(cache_dir: Path) -> list[Path]:
    """Remove the scratch directories in ``cache_dir`` whose writer is gone; return them."""
    try:
        names = os.listdir(cache_dir)
    except OSError:  # absent or unreadable: nothing to clean (the build reports real problems)
        return []
    removed = []
    for name in names:
        if not _SCRATCH.match(name):
            continue
        scratch = cache_dir / name
        reason = _stale_reason(scratch)
        if reason is None:
            continue
        key = name.split("-", 2)[1]
        aside = cache_dir / f".eval-{key}-stale-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.rename(scratch, aside)  # atomic: one remover wins, a half-removed directory keeps a stale name
        except OSError:
            continue
        shutil.rmtree(aside, ignore_errors=True)
        removed.append(scratch)
        log.warning("removed the eval-cache scratch directory %s (%s)", scratch, reason)
    return removed


def _stale_reason(scratch: Path) -> str | None:
    """Why ``scratch`` is left over, or None when its writer may still be running."""
    if scratch in _LIVE:
        return None
    try:
        owner = json.loads((scratch / OWNER_NAME).read_text())
    except (OSError, ValueError):
        owner = None
    if not isinstance(owner, dict) or "-build-" not in scratch.name:
        try:
            inside = [p for p in scratch.iterdir()] + [p for p in (scratch / "data").glob("*")]
            newest = max([scratch.stat().st_mtime] + [p.stat().st_mtime for p in inside])
        except OSError:
            return None  # vanished or unreadable meanwhile: leave it
        age = time.time() - newest
        return f"it has no owner record and has not changed for {age:.0f} s" if age > UNOWNED_GRACE_SECONDS else None
    pid = owner.get("pid")
    if owner.get("host") != socket.gethostname() or not isinstance(pid, int):
        log.info("kept the eval-cache scratch directory %s of host %s (pid %s)", scratch, owner.get("host"), pid)
        return None
    if pid == os.getpid():  # not in _LIVE: this process's earlier build failed and left it
        return "this process left it behind (an earlier failure)"
    return holder_gone(owner)  # judged as the writer lock judges its holder


def _discard(path: Path, reason: str) -> None:
    warnings.warn(f"eval cache {path} is unusable ({reason}); rebuilding it", CacheWarning, stacklevel=3)
    log.warning("eval cache %s is unusable (%s); rebuilding it", path, reason)
    aside = path.with_name(f".{path.name}-corrupt-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        os.replace(path, aside)
        shutil.rmtree(aside)
