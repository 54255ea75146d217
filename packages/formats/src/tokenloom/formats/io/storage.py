"""OS failures as named errors: ``OSError`` -> :class:`StorageError` with the path, errno and what to do.

    with storage_errors(output_dir, "writing"):
        ...   # an ENOSPC here becomes "StorageError: no space left on device while writing ... free N MB"

DataErrors pass through untouched; only ``OSError`` is translated (never KeyboardInterrupt).
"""

from __future__ import annotations

import contextlib
import errno as errnos
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenloom.formats.errors import DataError, StorageError

__all__ = ["check_readable", "storage_error", "storage_errors"]


def _free_mb(path: Path) -> str:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return f"{shutil.disk_usage(probe).free / 1e6:,.1f} MB"
    except OSError:
        return "unknown"


def _hint(code: int | None, path: Path, needed_mb: float | None) -> str:
    if code in (errnos.ENOSPC, errnos.EDQUOT):
        need = f" (about {needed_mb:,.0f} MB more is needed)" if needed_mb else ""
        return (
            f"Free space on the file system holding {path} ({_free_mb(path)} free now){need}, or choose an "
            "--output-dir on a larger one; rerunning the same command continues from the completed shards"
        )
    if code == errnos.EROFS:
        return "The file system is read-only: choose a writable --output-dir (or cache directory)"
    if code in (errnos.EACCES, errnos.EPERM):
        return f"Check the permissions of {path} and its directories (`ls -ld {path}`), or run as a user who may use it"
    if code == errnos.ELOOP:
        return f"{path} is a symlink loop; point it at a real file"
    if code == errnos.ENOENT:
        return "The file or directory vanished or never existed; check the path"
    if code == errnos.EIO:
        return "The device reported an I/O error; check the disk (dmesg) and re-copy the file"
    if code == errnos.EMFILE:
        return "Too many open files; raise the limit (ulimit -n) or use fewer workers"
    return "Check the path, its permissions and the free space of its file system"


def storage_error(exc: OSError, path: str | os.PathLike[str] | None = None, doing: str = "") -> StorageError:
    """The StorageError for ``exc``: the OS's own file name wins over ``path`` (the operation's target)."""
    where = Path(exc.filename) if exc.filename else Path(path) if path is not None else Path(".")
    name = errnos.errorcode.get(exc.errno or 0, "") if exc.errno else ""
    reason = exc.strerror or str(exc) or type(exc).__name__
    problem = f"{reason.lower()} ({name})" if name else reason.lower()
    if doing:
        problem += f" while {doing}"
    return StorageError(problem, errno=exc.errno, path=where, hint=_hint(exc.errno, where, None))


@contextlib.contextmanager
def storage_errors(path: str | os.PathLike[str] | None = None, doing: str = "") -> Iterator[None]:
    """Translate an ``OSError`` raised inside into a :class:`StorageError` (DataErrors pass through)."""
    try:
        yield
    except DataError:
        raise
    except OSError as exc:
        raise storage_error(exc, path, doing) from exc


def check_readable(paths: Iterable[str | os.PathLike[str]]) -> int:
    """Open each path for reading (no data read); a StorageError names the first that fails. Returns the count."""
    count = 0
    for path in paths:
        with storage_errors(path, "checking that it can be read"), open(path, "rb"):
            count += 1
    return count
