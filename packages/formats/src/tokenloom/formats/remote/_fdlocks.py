"""File descriptors that hold an ``flock``, closed in a forked child so that a fork never inherits a lock.

An ``flock`` belongs to the open file description, which a fork shares: if a DataLoader forks its
workers while a prefetch thread of the parent holds the cache's node lock (or a block's lock), each
child keeps a copy of that descriptor and the lock is not released until every copy is closed; the
children, which never knew they held it, then wait on it forever. Every lock the remote layer takes
goes through :func:`open_lock`; after a fork the child closes all of them (the parent still holds its
own) and every :class:`~tokenloom.formats.remote.cache.BlockCache` forgets its pinned maps, which it
pins again on next use.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable

__all__ = ["close_lock", "on_fork_in_child", "open_lock"]

_held: set[int] = set()
_guard = threading.Lock()
_forget: weakref.WeakSet = weakref.WeakSet()


def open_lock(path: str | os.PathLike[str]) -> int:
    """An fd of ``path`` (created if absent) for ``flock``, closed in any child forked while it is open."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    with _guard:
        _held.add(fd)
    return fd


def close_lock(fd: int) -> None:
    """Close an fd from :func:`open_lock` (releasing its lock)."""
    with _guard:
        _held.discard(fd)
    os.close(fd)


def on_fork_in_child(owner: object) -> None:
    """Call ``owner._forget_after_fork()`` in every child forked while ``owner`` lives."""
    _forget.add(owner)


def _after_fork_in_child() -> None:
    global _guard
    _guard = threading.Lock()  # another thread may have held it at the fork
    for fd in list(_held):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()
    for owner in list(_forget):
        forget: Callable[[], None] | None = getattr(owner, "_forget_after_fork", None)
        if forget is not None:
            forget()


os.register_at_fork(after_in_child=_after_fork_in_child)
