"""The packing-plan cache: verified on every open, rebuilt when damaged, in memory when unwritable.

    cache_dir/packplan-KEY/  token_start.npy length.npy prefix.npy bin_offsets.npy
                             plan.json   <- written last: settings + the size and xxh3 of every array

``plan.json`` is the completion record: a plan directory without it, with an array
of another size or checksum, or with an unparsable record is damaged. Damage is
logged, the directory moved aside and removed, and the plan rebuilt. A cache
directory that cannot be written (read-only mount, no permission, disk full)
gives an in-memory plan and a warning instead of an error.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from tokenloom.formats import DataError, MissingFileError
from tokenloom.formats.io import atomic_write_bytes, file_checksum, fsync_dir, safe_file

__all__ = ["RECORD_NAME", "cached_plan", "discard", "plan_damage"]

log = logging.getLogger("tokenloom.datasets")
RECORD_NAME = "plan.json"


class _Plan(Protocol):
    def save(self, directory: Path) -> None: ...


def plan_damage(directory: Path, arrays: tuple[str, ...]) -> str | None:
    """What is wrong with the published plan in ``directory``, or None if it is intact.

    Every file is checked to be a regular file before it is opened: a FIFO would block
    ``open()`` forever and a device would never end (either is damage: the plan is rebuilt).
    """
    try:
        record = json.loads(safe_file(directory, directory / RECORD_NAME).read_bytes())
    except MissingFileError:
        return f"{RECORD_NAME} is missing"
    except DataError as exc:  # a FIFO, device or directory where the record belongs, or a link out of the cache
        return f"{RECORD_NAME} is not a regular file ({exc.problem})"
    except (OSError, ValueError) as exc:
        return f"{RECORD_NAME} is unreadable ({exc})"
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict):
        return f"{RECORD_NAME} has no file checksums (written by an older tokenloom)"
    for name in arrays:
        path = directory / f"{name}.npy"
        expected = files.get(path.name)
        if not isinstance(expected, dict):
            return f"{RECORD_NAME} does not list {path.name}"
        try:
            size = safe_file(directory, path).stat().st_size
        except MissingFileError:
            return f"{path.name} is missing"
        except DataError as exc:
            return f"{path.name} is not a regular file ({exc.problem})"
        except OSError as exc:
            return f"{path.name} is unreadable ({exc.strerror})"
        if size != expected.get("bytes"):
            return f"{path.name} has {size} bytes, the record says {expected.get('bytes')}"
        if file_checksum(path) != expected.get("xxh3_128"):
            return f"{path.name} does not match its recorded checksum"
    return None


def discard(directory: Path) -> None:
    """Move a damaged cache directory aside (atomic: readers never see half of it) and remove it."""
    aside = directory.with_name(f".{directory.name}-damaged-{os.getpid()}")
    with contextlib.suppress(OSError):
        os.replace(directory, aside)
        shutil.rmtree(aside, ignore_errors=True)


def cached_plan(
    cache_dir: Path, key: str, build: Callable[[], _Plan], meta: dict[str, Any], arrays: tuple[str, ...]
) -> tuple[Path, _Plan | None]:
    """``(directory, None)`` of the verified plan under ``key`` (built and published first if needed),
    or ``(directory, plan)`` with the plan held in memory when the cache cannot be written."""
    final = cache_dir / f"packplan-{key}"
    if final.exists():
        damage = plan_damage(final, arrays)
        if damage is None:
            return final, None
        log.warning("packing-plan cache %s is damaged (%s); rebuilding it", final, damage)
        discard(final)
    plan = build()
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".packplan-{key}-", dir=cache_dir))
    except OSError as exc:
        log.warning("cannot write the packing-plan cache %s (%s); keeping the plan in memory", cache_dir, exc)
        return final, plan
    try:
        plan.save(scratch)
        files = {
            f"{name}.npy": {
                "bytes": (scratch / f"{name}.npy").stat().st_size,
                "xxh3_128": file_checksum(scratch / f"{name}.npy"),
            }
            for name in arrays
        }
        record = json.dumps({**meta, "files": files}, sort_keys=True).encode()
        atomic_write_bytes(scratch / RECORD_NAME, record)  # the completion record, last
        try:
            os.replace(scratch, final)
            fsync_dir(cache_dir)
        except OSError:  # another process published it first: theirs is identical
            if plan_damage(final, arrays) is not None:
                raise
    except OSError as exc:
        log.warning("cannot write the packing-plan cache %s (%s); keeping the plan in memory", cache_dir, exc)
        return final, plan
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(scratch)
    return final, None
