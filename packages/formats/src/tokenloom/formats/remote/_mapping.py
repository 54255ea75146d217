"""A read-only memory map that holds no file descriptor once made.

``mmap.mmap`` keeps a ``dup`` of the file's descriptor for as long as the map lives (Python 3.13 adds
``trackfd=False``): an unbounded cache keeps every block it read mapped, so an epoch over more blocks
than ``ulimit -n`` failed with EMFILE mid-way (1,533 blocks under the usual 1024). A mapping needs no
descriptor once made, so below 3.13 the map is made with libc's ``mmap`` and the descriptor closed by
the caller right after; the pages are unmapped when the last view of them (a numpy array, a slice) is
released.

The views export the pages through a numpy array, which the cycle collector never tracks: a view left in a
reference cycle is then unmapped only when it is freed, after the cycle's finalizers (``__del__``, a
generator's ``finally``) ran. Exported straight from the ctypes array (tracked), the unmap was a weakref
callback the collector runs first, and a finalizer reading the view crashed the process (SIGSEGV).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys
import weakref

import numpy as np

__all__ = ["map_readonly"]

if sys.version_info < (3, 13):
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    _libc.mmap.restype = ctypes.c_void_p
    _libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    _libc.munmap.restype = ctypes.c_int
    _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    _FAILED = ctypes.c_void_p(-1).value


def map_readonly(fd: int, size: int) -> memoryview:
    """``size`` bytes of the open file ``fd`` (``size`` > 0), shared and read-only; ``fd`` may be closed at once."""
    if sys.version_info >= (3, 13):
        return memoryview(mmap.mmap(fd, size, access=mmap.ACCESS_READ, trackfd=False))  # pyright: ignore[reportCallIssue]
    address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if address in (None, _FAILED):
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    pages = (ctypes.c_ubyte * size).from_address(address)
    weakref.finalize(pages, _libc.munmap, address, size).atexit = False  # never under a view still in use at exit
    # untracked by gc: see the module's note. A ctypes array exports the buffer protocol; numpy's stubs for
    # Python 3.11 name the buffer types one by one, so the checker cannot see that
    exporter = np.frombuffer(pages, dtype=np.uint8)  # pyright: ignore[reportCallIssue, reportArgumentType]
    exporter.flags.writeable = False
    return memoryview(exporter)
