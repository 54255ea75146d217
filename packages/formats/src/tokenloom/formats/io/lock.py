"""One writer per output: an ``O_EXCL`` lock file beside the output, holding pid, host and start time.

    with output_lock(out):        # OUT.tokenloom-lock is created atomically, or OutputLockedError
        ...write OUT...

No ``flock``: it is unreliable on Lustre and NFS, while ``O_CREAT | O_EXCL`` is atomic
there too. The file lives beside the output (``OUT.tokenloom-lock``), not inside it,
so clearing the output never removes the lock. A lock whose holder is gone is stale
and is broken with a warning: on the same host when the pid no longer runs (or runs
a different process, by its start time in /proc); for an unreadable lock file once
it is older than a grace period. A lock held on another host is never guessed at:
the error names the host and pid and the file to delete.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import glob
import logging
import os
import re
import socket
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from tokenloom.formats.errors import OutputLockedError, UnsafePathError
from tokenloom.formats.io.atomic import TMP_SUFFIX, make_parents, remove_empty
from tokenloom.formats.io.storage import storage_errors

__all__ = ["LOCK_SUFFIX", "holder_gone", "lock_path", "output_lock", "remove_dead_temps"]

LOCK_SUFFIX = ".tokenloom-lock"
#: An empty or unparsable lock file (its writer died between create and write) is stale after this many seconds.
UNREADABLE_GRACE_SECONDS = 30.0
#: A lock record is a few hundred bytes; a larger file is not one of ours and is read no further.
MAX_LOCK_BYTES = 64 << 10
log = logging.getLogger(__name__)
_HELD: dict[Path, int] = {}  # lock files this process holds -> nesting depth (tokenize's convert step)


def lock_path(output: str | os.PathLike[str]) -> Path:
    """``OUT.tokenloom-lock`` beside ``output`` (real path, so a symlinked OUT shares its lock)."""
    real = Path(os.path.realpath(os.fspath(output)))
    return real.with_name(real.name + LOCK_SUFFIX)


def _process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), or None where /proc is absent."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return raw.rsplit(b")", 1)[-1].split()[19].decode()


def holder_record() -> dict[str, Any]:
    """This process's holder record (pid, host, start, command): what a lock or scratch directory names as owner."""
    pid = os.getpid()
    return {
        "pid": pid,
        "host": socket.gethostname(),
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "process_start": _process_start(pid),
        # an argument that is not UTF-8 (a file name in latin-1) holds surrogates that JSON cannot carry
        "command": " ".join(sys.argv[:6])[:300].encode("utf-8", "backslashreplace").decode("utf-8"),
    }


def remove_dead_temps(final: str | os.PathLike[str]) -> list[Path]:
    """Remove the temp files beside ``final`` (``final.<pid>-<8 hex>.tmp``, :func:`~tokenloom.formats.io.temp_path`)
    whose writer no longer runs on this host (a SIGKILL between write and rename); return them. A temp of a live
    pid (its writer, or a reused pid) is kept."""
    final = Path(final)
    pattern = re.compile(re.escape(final.name) + r"\.(\d+)-[0-9a-f]{8}" + re.escape(TMP_SUFFIX))
    removed = []
    for path in final.parent.glob(f"{glob.escape(final.name)}.*{TMP_SUFFIX}"):
        found = pattern.fullmatch(path.name)
        if found is not None and not pid_alive(int(found.group(1))):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path)
    return removed


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (one owned by another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stale_reason(path: Path, holder: dict[str, Any] | None) -> str | None:
    """Why the lock at ``path`` is stale, or None if its holder may still be running."""
    if holder is None:
        try:
            age = time.time() - path.lstat().st_mtime
        except FileNotFoundError:
            return "it vanished"
        return f"it is unreadable and {age:.0f} s old" if age > UNREADABLE_GRACE_SECONDS else None
    if holder.get("host") != socket.gethostname():
        return None
    if holder.get("pid") == os.getpid() and path not in _HELD:
        return "this process left it behind (an earlier failure)"
    return holder_gone(holder)


def holder_gone(holder: dict[str, Any]) -> str | None:
    """Why the process a holder record of this host names (``pid``, ``process_start``) no longer runs, or None."""
    pid = holder.get("pid")
    if not isinstance(pid, int) or not pid_alive(pid):
        return f"process {pid} on this host is gone"
    recorded = holder.get("process_start")
    if recorded is not None and _process_start(pid) not in (None, recorded):
        return f"pid {pid} now belongs to another process"
    return None


def _not_a_lock(path: Path, kind: str) -> UnsafePathError:
    return UnsafePathError(
        f"{path.name} is {kind}, expected tokenloom's writer-lock file (a small regular file)",
        path=path,
        field="lock",
        hint=f"If no tokenloom process writes this output, delete it (rm {path}) and run again",
    )


def _read(path: Path) -> dict[str, Any] | None:
    """The holder record of the lock at ``path`` (None: absent, unreadable or not JSON).

    Never blocks and never reads without bound: the file is opened without following a
    symlink and without waiting on a FIFO, must be a regular file, and at most
    MAX_LOCK_BYTES are read; a symlink, FIFO, device or directory there is an UnsafePathError.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _not_a_lock(path, f"a symbolic link (to {os.readlink(path)})") from None
        if exc.errno == errno.ENXIO:  # a socket
            raise _not_a_lock(path, "a socket") from None
        return None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else "a special file"
            raise _not_a_lock(path, kind)
        raw = os.read(fd, MAX_LOCK_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(raw) > MAX_LOCK_BYTES:
        return None  # not a record of ours: unreadable, stale after the grace period
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return payload if isinstance(payload, dict) else None


def _acquire(path: Path, record: bytes) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, record)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)  # never leave a lock we failed to write
        raise
    os.close(fd)
    return True


def _break_stale(path: Path, holder: dict[str, Any] | None, reason: str) -> None:
    """Remove a stale lock, unless another process replaced it meanwhile (rename, then re-check)."""
    aside = path.with_name(f"{path.name}.stale-{os.getpid()}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    if _read(aside) != holder:  # someone took the lock between our read and rename: give it back
        with contextlib.suppress(OSError):
            os.link(aside, path)  # never over a lock taken meanwhile (link fails if path exists)
        aside.unlink(missing_ok=True)
        return
    aside.unlink(missing_ok=True)
    log.warning("removed a stale writer lock %s (%s): %s", path, reason, holder)


@contextlib.contextmanager
def output_lock(output: str | os.PathLike[str], *, what: str = "output") -> Iterator[Path]:
    """Hold the exclusive writer lock of ``output`` for the ``with`` block; yields the lock file's path."""
    path = lock_path(output)
    if path in _HELD:  # this process already writes OUT (tokenize converting its staging into OUT)
        _HELD[path] += 1
        try:
            yield path
        finally:
            _HELD[path] -= 1
        return
    with storage_errors(path, "taking the writer lock"):
        created = make_parents(path)
        try:
            _take(path, what)
        except BaseException:
            remove_empty(created)
            raise
    _HELD[path] = 1
    try:
        yield path
    finally:
        del _HELD[path]
        with contextlib.suppress(OSError, UnsafePathError):
            if (_read(path) or {}).get("pid") == os.getpid():
                path.unlink()
        remove_empty(created)  # a run that failed leaves no empty directories behind (a finished one wrote there)


def _take(path: Path, what: str) -> None:
    mine = holder_record()
    record = orjson.dumps(mine, option=orjson.OPT_INDENT_2)
    for _attempt in range(5):
        if _acquire(path, record):
            break
        holder = _read(path)
        reason = _stale_reason(path, holder)
        if reason is None:
            who = (
                f"pid {holder.get('pid')} on host {holder.get('host')} since {holder.get('started')} "
                f"({holder.get('command', '')})"
                if holder
                else "a process that has not yet written its name"
            )
            raise OutputLockedError(
                f"another process is writing this {what}: {who}",
                path=path,
            )
        _break_stale(path, holder, reason)
    else:
        raise OutputLockedError(f"could not take the writer lock of this {what} after 5 attempts", path=path)
