"""Crash-safe writing: temp name, flush + fsync, ``os.replace``, fsync of the directory.

A reader never sees a half-written file under its final name: either the old
state or the complete new file.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "TMP_SUFFIX",
    "WRITING_MARKER",
    "atomic_file",
    "atomic_write_bytes",
    "fsync_dir",
    "make_parents",
    "publish",
    "remove_empty",
]

TMP_SUFFIX = ".tmp"
#: Present in a dataset directory while a writer runs; readers refuse such a directory.
WRITING_MARKER = ".tokenloom-writing"


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename or unlink inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp: Path, final: Path) -> None:
    """Rename the finished (fsynced) ``tmp`` over ``final`` and make the rename durable."""
    os.replace(tmp, final)
    fsync_dir(final.parent)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Open ``path.tmp`` for binary writing; on success publish it as ``path``.

    On an exception the temp file is removed and ``path`` is left untouched.
    """
    final = Path(path)
    tmp = final.with_name(final.name + TMP_SUFFIX)
    handle = open(tmp, "wb")  # noqa: SIM115 - closed below on every path
    try:
        yield handle
        handle.flush()
        os.fsync(handle.fileno())
        handle.close()
        os.replace(tmp, final)
        fsync_dir(final.parent)
    except BaseException:
        handle.close()
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` crash-safely."""
    with atomic_file(path) as handle:
        handle.write(data)


def make_parents(path: str | os.PathLike[str]) -> list[Path]:
    """Create the missing parents of ``path``; the ones created, deepest first (for :func:`remove_empty`)."""
    created = []
    parent = Path(path).parent
    while not parent.exists() and parent != parent.parent:
        created.append(parent)
        parent = parent.parent
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return created


def remove_empty(directories: list[Path]) -> None:
    """Remove the directories a failed writer created, deepest first, as long as they are empty."""
    for directory in directories:
        try:
            directory.rmdir()
        except OSError:  # not empty (someone else wrote there) or already gone: leave it
            return
