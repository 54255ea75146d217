"""The cache directory's failures as named errors that name the directory and say what to do.

A cache directory that is a file, or sits under one, and a symlink loop on its path are configuration
(ConfigError, field ``block_cache_dir``); a directory this process may not write and a full disk are the OS
refusing (StorageError, with the errno). Without this they surface as a bare ``NotADirectoryError`` or
``OSError: [Errno 40]`` from a ``stat`` deep in the cache, or a full disk as "the object-store client
failed" (the block is written where the GET runs, possibly a helper process that reports an
``OSError`` only as text: its ``[Errno N]`` is read back from the message).
"""

from __future__ import annotations

import errno as errnos
import functools
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tokenloom.formats.errors import ConfigError, DataError, StorageError
from tokenloom.formats.io.storage import _free_mb

__all__ = ["cache_dir_error", "named_cache_errors"]

_SETTING = "RemoteOptions(block_cache_dir=...) (or $TOKENLOOM_CACHE_DIR)"
_NOT_WRITABLE = {errnos.EACCES, errnos.EPERM, errnos.EROFS}
_FULL = {errnos.ENOSPC, errnos.EDQUOT}
_PATH_CODES = {errnos.ENOTDIR, errnos.ELOOP, errnos.EEXIST}
_ERRNO_TEXT = re.compile(r"\[Errno (\d+)\]")

F = TypeVar("F", bound=Callable[..., Any])


def _code(exc: BaseException) -> int | None:
    code = getattr(exc, "errno", None)
    if code is None and isinstance(exc, StorageError):
        found = _ERRNO_TEXT.search(exc.problem)
        code = int(found[1]) if found else None
    return code


def _culprit(root: Path, failed: str | None) -> tuple[Path, str] | None:
    """The first folder (from the top) of ``root`` or of the path that ``failed`` in it that is a loop or a file.

    The failed path itself counts when it is a link: ``mkdir`` of a dangling one (``v1`` pointing at a scratch
    disk that is gone) fails with EEXIST on the link.
    """
    chain = [*reversed(Path(failed).parents)] if failed else []
    if failed and os.path.islink(failed):
        chain.append(Path(failed))
    below = [p for p in chain if p.is_relative_to(root) and p != root]
    for part in [*reversed(root.parents), root, *below]:
        try:
            info = os.stat(part)
        except FileNotFoundError:
            return (part, "dangling") if os.path.islink(part) else None
        except OSError as exc:
            if exc.errno == errnos.ELOOP:
                return part, "loop"
            return None
        if not stat.S_ISDIR(info.st_mode):
            return part, "file"
    return None


def cache_dir_error(root: str | os.PathLike[str], exc: BaseException) -> DataError | None:
    """The named error for ``exc`` raised while using the cache at ``root``; None when it is not about the directory."""
    root = Path(root)
    code = _code(exc)
    if code in _PATH_CODES or (code is None and isinstance(exc, NotADirectoryError | FileExistsError)):
        failed = getattr(exc, "filename", None) or getattr(exc, "path", None)
        found = _culprit(root, os.fspath(failed) if failed else None)
        if found is None:
            return None
        part, kind = found
        if kind == "dangling":
            what = f"a symlink to {os.readlink(part)}, which does not exist"
            hint = f"Create the directory it points to, or set {_SETTING} to another directory"
        elif kind == "loop":
            what = "a symlink loop"
            hint = f"Point the link {part} at a real directory (`ls -l {part}`), or set {_SETTING} to another directory"
        else:
            what = "a file, not a directory"
            hint = f"Set {_SETTING} to a directory, or move the file {part} away (the cache is rebuilt from the store)"
        problem = f"the cache directory {root} cannot be used: {part} is {what}"
        return ConfigError(problem, path=root, field="block_cache_dir", hint=hint)
    if code in _NOT_WRITABLE:
        why = "is on a read-only file system" if code == errnos.EROFS else "is not writable by this process"
        detail = errnos.errorcode[code]
        hint = (
            f"Set {_SETTING} to a directory this user may write (remote data is cached there), or fix its "
            f"permissions (`ls -ld {root}`)"
        )
    elif code in _FULL:
        why = "is over its disk quota" if code == errnos.EDQUOT else "is full"
        detail = f"{errnos.errorcode[code]}, {_free_mb(root)} free"
        hint = (
            f"Free space in {root}, set {_SETTING} to a larger disk, or bound the cache below the free space with "
            "cache_limit= (or $TOKENLOOM_CACHE_LIMIT, e.g. 20GB): blocks are then evicted and fetched again"
        )
    else:
        return None
    return StorageError(f"the cache directory {root} {why} ({detail})", errno=code, path=root, hint=hint)


def named_cache_errors(method: F) -> F:
    """Decorate a method of an object with ``.root``: the cache directory's failures become named errors."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except (OSError, StorageError) as exc:
            named = cache_dir_error(self.root, exc)
            if named is None:
                raise
            raise named from exc

    return wrapper  # type: ignore[return-value]
