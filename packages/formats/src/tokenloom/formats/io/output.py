"""Output directories: creating one safely, and the one rule for cutting entries into shards."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tokenloom.formats.errors import ConfigError, FormatError
from tokenloom.formats.io.atomic import WRITING_MARKER, fsync_dir
from tokenloom.formats.io.manifest import MANIFEST_NAME
from tokenloom.formats.io.safety import check_replaceable
from tokenloom.formats.io.urls import refuse_remote_output

__all__ = ["prepare_output_dir", "refuse_unfinished", "shard_cut", "start_output_dir"]


def shard_cut(ends: np.ndarray, begin: int, filled: int, shard_size_tokens: int) -> int:
    """Where the entries from ``begin`` stop going into a shard that already holds ``filled`` tokens.

    ``ends`` is the cumulative token count of a batch's entries. Whole entries are
    taken until the shard holds at least ``shard_size_tokens`` (the entry crossing
    the target stays in it), and at least one. Every writer that shards by size
    uses this one rule, so shard files are the same however entries are batched.
    """
    base = int(ends[begin - 1]) if begin else 0
    stop = int(np.searchsorted(ends, base + shard_size_tokens - filled, side="left")) + 1
    return max(begin + 1, min(stop, len(ends)))


_COMPLETION_FILES = (MANIFEST_NAME, "meta.json")  # the files whose presence means "complete"


def prepare_output_dir(path: Path, *, overwrite: bool, ours: Callable[[str], bool] | None = None) -> None:
    """Create ``path``; refuse a non-empty one unless ``overwrite`` (then clear its files).

    Only tokenloom output (or files ``ours`` accepts) is ever cleared: see ``io.safety.check_replaceable``.
    """
    refuse_remote_output(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{path} exists and is not a directory", path=path)
    path.mkdir(parents=True, exist_ok=True)
    existing = [p for p in path.iterdir()]
    if existing and not overwrite:
        raise ConfigError(
            f"output directory is not empty ({len(existing)} entries)",
            path=path,
            hint="Choose an empty directory or pass --overwrite (overwrite=True)",
        )
    check_replaceable(path, ours)
    for entry in existing:
        if entry.is_dir() and not entry.is_symlink():
            raise ConfigError(
                f"refusing to overwrite: {entry.name} is a directory", path=path, hint="Remove it by hand"
            )
    if existing:
        # Mark the directory unfinished and drop what declares it complete before deleting
        # anything else, so a crash while clearing never leaves an old manifest over missing files.
        (path / WRITING_MARKER).write_bytes(b"")
        for name in _COMPLETION_FILES:
            with contextlib.suppress(FileNotFoundError):
                (path / name).unlink()
        fsync_dir(path)
        for entry in existing:
            if entry.name != WRITING_MARKER:
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()


def refuse_unfinished(root: Path, *, what: str = "dataset") -> None:
    """FormatError if a writer's marker says ``root`` is unfinished (a killed or running writer)."""
    if (root / WRITING_MARKER).exists():
        raise FormatError(
            f"{WRITING_MARKER} is present: a writer did not finish (killed or still running)",
            path=root,
            hint=f"Wait for the writer, or rerun the command that writes this {what}",
        )


def start_output_dir(path: Path, *, overwrite: bool) -> None:
    """``prepare_output_dir``, then mark ``path`` unfinished (durably) until the writer commits."""
    prepare_output_dir(path, overwrite=overwrite)
    (path / WRITING_MARKER).write_bytes(b"")
    fsync_dir(path)
