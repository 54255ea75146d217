"""Refuse paths that leave the dataset root, and files that are not regular files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tokenloom.formats.errors import MissingFileError, UnsafePathError

__all__ = ["safe_file"]


def safe_file(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """``path`` if it is a regular file whose real location is inside ``root``.

    Symlinks are followed; one that resolves outside the root is an UnsafePathError,
    as is a FIFO, socket or device (reading one could hang or never end).
    """
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError as exc:
        raise MissingFileError(f"{path.name} does not exist", path=path) from exc
    if not stat.S_ISREG(info.st_mode):
        kind = "FIFO" if stat.S_ISFIFO(info.st_mode) else "directory" if stat.S_ISDIR(info.st_mode) else "special file"
        raise UnsafePathError(f"{path.name} is a {kind}, expected a regular file", path=path)
    real_root = Path(root).resolve()
    real = path.resolve()
    if real != real_root and real_root not in real.parents:
        raise UnsafePathError(
            f"{path.name} resolves to {real}, outside the dataset root {real_root}",
            path=path,
            hint="Copy the file into the dataset directory instead of linking outside it",
        )
    return path
