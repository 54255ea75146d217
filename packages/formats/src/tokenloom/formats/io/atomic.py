"""Crash-safe writing: temp name, flush + fsync, ``os.replace``, fsync of the directory.

A reader never sees a half-written file under its final name: either the old
state or the complete new file.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, cast

__all__ = [
    "TMP_SUFFIX",
    "TempFile",
    "WRITING_MARKER",
    "atomic_file",
    "atomic_write_bytes",
    "fsync_dir",
    "make_parents",
    "remove_empty",
    "temp_base",
    "temp_path",
]

TMP_SUFFIX = ".tmp"
#: Present in a dataset directory while a writer runs; readers refuse such a directory.
WRITING_MARKER = ".tokenloom-writing"
_TEMP_TAG = re.compile(r"\.\d+-[0-9a-f]{8}" + re.escape(TMP_SUFFIX) + "$")


def temp_path(final: str | os.PathLike[str]) -> Path:
    """A temp name beside ``final`` that no other writer uses: ``final.<pid>-<8 hex>.tmp``.

    Two processes (or two writers in one process) writing the same file never share
    a temp file, so one's ``os.replace`` cannot take the other's half-written bytes
    or leave it with ENOENT; the last complete file wins.
    """
    final = Path(final)
    return final.with_name(f"{final.name}.{os.getpid()}-{secrets.token_hex(4)}{TMP_SUFFIX}")


def temp_base(name: str) -> str:
    """The final name a temp name stands for (``a.idx.123-0a1b2c3d.tmp`` -> ``a.idx``; ``a.tmp`` -> ``a``)."""
    return _TEMP_TAG.sub("", name) if _TEMP_TAG.search(name) else name.removesuffix(TMP_SUFFIX)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename or unlink inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class TempFile:
    """A file streamed to a temp name beside ``final`` (unique per writer: :func:`temp_path`), published as
    ``final`` by :meth:`publish` or removed by :meth:`abort`: what every writer of a data file does."""

    def __init__(self, final: str | os.PathLike[str], mode: str = "wb") -> None:
        self.final = Path(final)
        self.tmp = temp_path(self.final)
        self.handle = cast(BinaryIO, open(self.tmp, mode))  # noqa: SIM115 - closed in finish/abort

    def finish(self) -> None:
        """Flush, fsync and close: the bytes are durable under the temp name (idempotent)."""
        if not self.handle.closed:
            self.handle.flush()
            os.fsync(self.handle.fileno())
            self.handle.close()

    def publish(self, *, sync_dir: bool = True) -> None:
        """:meth:`finish`, rename over ``final``; ``sync_dir``: make the rename durable now (else the caller's
        later directory fsync does)."""
        self.finish()
        os.replace(self.tmp, self.final)
        if sync_dir:
            fsync_dir(self.final.parent)

    def abort(self) -> None:
        """Close and remove the temp file; ``final`` is untouched.

        The close may fail again (its flush of buffered bytes, on a disk still full); the handle is closed
        all the same, and the temp file is removed whatever the close said.
        """
        with contextlib.suppress(OSError):
            self.handle.close()
        with contextlib.suppress(FileNotFoundError):
            self.tmp.unlink()


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Open a temp file beside ``path`` (:class:`TempFile`); on success publish it as ``path``.

    On an exception the temp file is removed and ``path`` is left untouched.
    """
    out = TempFile(path, "xb")
    try:
        yield out.handle
        out.publish()
    except BaseException:
        out.abort()
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
