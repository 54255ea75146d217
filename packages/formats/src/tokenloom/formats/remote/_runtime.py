"""Which processes may call obstore in-process, and which must go through the helper process.

obstore keeps one tokio runtime per address space, started by its first request. A child forked after
that inherits the runtime without its threads: any obstore call there hangs, with a store made in the
child too (measured with obstore 0.12.1: every such child hung; children of a parent that never made a
request did not). So the rule is about the address space, not the store:

- a process whose address space holds a started runtime, its own, may keep using it;
- a process forked from one that had started it (tracked by pid; at each fork the parent also checks
  for tokio threads, so a runtime started by other code counts too) must never touch it: the helper;
- a process with no runtime yet starts one only if it is a child process (a DataLoader worker, a pool
  worker): a top-level process (a training script, a rank under torchrun) usually opens its datasets
  and then forks its DataLoader workers, which could then not use obstore at all; it uses the helper.
"""

from __future__ import annotations

import multiprocessing
import os
import sys

__all__ = ["claim", "in_process", "runtime_owner", "tokio_threads"]

#: the pid of the process that started obstore's runtime in this address space (this one or an ancestor
#: whose memory a fork copied); None while no request was made here
_owner: int | None = None


def runtime_owner() -> int | None:
    """The pid that started obstore's runtime in this address space, or None."""
    return _owner


def in_process() -> bool:
    """True when this process calls obstore itself; False when its calls must go through the helper."""
    global _owner
    pid = os.getpid()
    if _owner is not None:
        return _owner == pid
    if multiprocessing.parent_process() is None:
        return False
    _owner = pid  # set before the first request: a fork from now on must not use the runtime
    return True


def claim() -> None:
    """This process starts obstore's runtime (a helper forked from a process that never did)."""
    global _owner
    _owner = os.getpid()


def tokio_threads() -> bool:
    """Whether a tokio runtime runs threads in this process (obstore's, or any other library's)."""
    if "obstore" not in sys.modules:
        return False
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return True  # cannot tell: assume it was started
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm", "rb") as handle:
                if handle.read().startswith(b"tokio-"):
                    return True
        except OSError:
            continue
    return False


def _before_fork() -> None:
    global _owner
    if _owner is None and tokio_threads():
        _owner = os.getpid()  # started by other code: this process may use it, its children may not


os.register_at_fork(before=_before_fork)
