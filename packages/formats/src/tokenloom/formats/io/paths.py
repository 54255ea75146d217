"""Refuse paths that leave the dataset root, and files that are not regular files."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

from tokenloom.formats.errors import MissingFileError, UnsafePathError
from tokenloom.formats.io.urls import StoredPath

__all__ = ["as_path", "first_index", "names_in", "pair_stats", "starts_with", "safe_file", "safe_stat", "walk"]


def as_path(path: str | os.PathLike[str]) -> Path:
    """``Path(path)``, keeping a :class:`~tokenloom.formats.io.source.StoredPath` (an object-store path) as it is."""
    return path if isinstance(path, StoredPath) else Path(path)  # pyright: ignore[reportReturnType]


def walk(root: Path) -> Iterator[tuple[Path, list[str], list[str]]]:
    """``os.walk(root)`` (symlinked folders not followed) with each folder as a path of ``root``'s kind."""
    if isinstance(root, StoredPath):
        yield from root.walk()  # pyright: ignore[reportAttributeAccessIssue]
        return
    for directory, folders, files in os.walk(root, followlinks=False):
        yield Path(directory), folders, files


def names_in(directory: str | os.PathLike[str]) -> list[str]:
    """The names ``Path(directory).glob("*")`` matches, without a Path object each (a detector looking
    at 2,000 shard files); like glob, [] where listing is not permitted."""
    if isinstance(directory, StoredPath):
        return [path.name for path in directory.iterdir()]  # pyright: ignore[reportAttributeAccessIssue]
    try:
        return os.listdir(directory)
    except PermissionError:
        return []


def first_index(directory: str | os.PathLike[str]) -> Path | None:
    """The first ``.idx`` file of ``directory`` by name (what the native and Megatron detectors look at), or None."""
    names = [name for name in names_in(directory) if name.endswith(".idx")]
    return as_path(directory) / min(names) if names else None


def starts_with(path: str | os.PathLike[str], magic: bytes) -> bool:
    """Whether the file at ``path`` opens and begins with ``magic`` (False for a directory or an unreadable path)."""
    try:
        with as_path(path).open("rb") as handle:
            return handle.read(len(magic)) == magic
    except OSError:
        return False


def safe_file(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """``path`` if it is a regular file whose real location is inside ``root``.

    Symlinks are followed; one that resolves outside the root is an UnsafePathError,
    as is a FIFO, socket or device (reading one could hang or never end).
    """
    path = as_path(path)
    safe_stat(root, path)
    return path


def pair_stats(root: str | os.PathLike[str], stem: str) -> tuple[os.stat_result, os.stat_result]:
    """The stats (symlinks followed) of ``stem.idx`` and ``stem.bin`` (native and Megatron shards) after
    :func:`safe_stat`'s checks. A missing partner is named first, whatever is wrong with the file that is there."""
    remote = isinstance(root, StoredPath)  # else names joined as text: 1,000 shards, no Path each
    idx_path, bin_path = [
        as_path(root) / f"{stem}{suffix}" if remote else os.path.join(root, stem + suffix)
        for suffix in (".idx", ".bin")
    ]
    exists = (lambda path: path.exists()) if remote else os.path.lexists  # (a dangling link exists)
    try:
        return safe_stat(root, idx_path), safe_stat(root, bin_path)
    except Exception:
        if not exists(idx_path):
            if not exists(bin_path):
                raise MissingFileError(f"neither {stem}.idx nor {stem}.bin exists", path=idx_path) from None
            raise MissingFileError(f"{stem}.bin has no index {stem}.idx", path=bin_path) from None
        if not exists(bin_path):
            raise MissingFileError(f"{stem}.idx has no data file {stem}.bin", path=idx_path) from None
        raise


def safe_stat(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> os.stat_result:
    """The checks of :func:`safe_file`; the file's stat (symlinks followed), so callers need no second one."""
    if isinstance(path, StoredPath):  # an object: a regular file, its key checked inside the prefix at listing
        try:
            info = path.stat()  # pyright: ignore[reportAttributeAccessIssue]
        except FileNotFoundError as exc:
            raise MissingFileError(f"{path.name} does not exist", path=path) from exc  # pyright: ignore
        _check_regular(path, info)  # pyright: ignore[reportArgumentType]
        return info
    text = os.fspath(path)
    if "\0" in text:  # the OS would refuse it with a bare ValueError
        raise UnsafePathError(
            f"file name {Path(text).name!r} contains a NUL byte",
            path=text.replace("\0", "\\0"),
            hint="The name came from a damaged or hand-edited index/manifest; restore it or re-create the dataset",
        )
    head, name = os.path.split(text)
    if name not in ("", ".", "..") and head == os.fspath(root):
        # the common case, a plain entry right inside the root (``root / name``): one lstat and no Path objects
        # instead of resolving both paths (which lstats every component); opening 1,000 shards makes 4,000 of these
        try:
            info = os.lstat(text)
        except FileNotFoundError as exc:
            raise MissingFileError(f"{name} does not exist", path=Path(text)) from exc
        if stat.S_ISREG(info.st_mode):
            return info  # not a link, directly in the root: its real location is inside the real root
        if not stat.S_ISLNK(info.st_mode):
            _check_regular(Path(text), info)
    path = Path(text)
    try:
        info = path.stat()
    except FileNotFoundError as exc:
        raise MissingFileError(f"{path.name} does not exist", path=path) from exc
    _check_regular(path, info)
    real_root = Path(root).resolve()
    real = path.resolve()
    if real != real_root and real_root not in real.parents:
        raise UnsafePathError(
            f"{path.name} resolves to {real}, outside the dataset root {real_root}",
            path=path,
            hint="Copy the file into the dataset directory instead of linking outside it",
        )
    return info


def _check_regular(path: Path, info: os.stat_result) -> None:
    if not stat.S_ISREG(info.st_mode):
        kind = "FIFO" if stat.S_ISFIFO(info.st_mode) else "directory" if stat.S_ISDIR(info.st_mode) else "special file"
        raise UnsafePathError(f"{path.name} is a {kind}, expected a regular file", path=path)
