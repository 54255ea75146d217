"""Wall and CPU seconds of a command's whole process tree, worker processes of a fork server included.

``getrusage(RUSAGE_CHILDREN)`` counts a descendant only once its parent has waited for it. Workers forked by a
multiprocessing fork server are waited for by the server, and the server itself is never waited for by the command
(it exits after the command, an orphan adopted by init), so their CPU never reaches the caller: measured here, a
command whose two forkserver workers spin 4 CPU-s reported 0.07 CPU-s. This process makes itself the child
subreaper (Linux ``PR_SET_CHILD_SUBREAPER``): the orphaned server is re-parented to it, waited for here, and its
CPU and that of the workers it waited for are counted.
"""

from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import time
from collections.abc import Mapping, Sequence

PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed: the CPU figures would miss workers")


def _reap_all() -> None:
    """Wait for every descendant left (the orphaned fork server): nothing else runs children meanwhile."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def timed_tree(
    cmd: Sequence[str], env: Mapping[str, str] | None = None, *, text: bool = False
) -> tuple[float, float, subprocess.CompletedProcess]:
    """(wall s, user+sys CPU s of the whole tree, the completed process); the wall ends when the tree has ended."""
    _become_subreaper()
    _reap_all()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(list(cmd), capture_output=True, text=text, env=dict(env) if env else None, check=False)
    _reap_all()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done
