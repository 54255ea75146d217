"""Progress of long reads (deep validation): ``on_progress(stage, done, total)`` for one call.

``open_dataset(path, validate="deep", on_progress=callback)`` sets the callback for the
duration of the open; the shared loops that do the reading (file checksums against a
manifest, the token-range scan, the EOS-placement check) report through it, so every
reader that uses them reports without a parameter of its own. Each stage reports
``(stage, 0, total)`` when it starts, then monotone ``done`` values ending at ``total``.
Units: bytes for "checksums", tokens for "token ids", entries for "EOS placement".
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

__all__ = ["ProgressCallback", "Stage", "reporting"]

ProgressCallback = Callable[[str, int, int], None]

_CALLBACK: ContextVar[ProgressCallback | None] = ContextVar("tokenloom_progress", default=None)


@contextlib.contextmanager
def reporting(callback: ProgressCallback | None) -> Iterator[None]:
    """Send the progress of the reads inside the block to ``callback`` (None: keep the outer one)."""
    if callback is None:
        yield
        return
    token = _CALLBACK.set(callback)
    try:
        yield
    finally:
        _CALLBACK.reset(token)


class Stage:
    """One stage of work of a known size; ``advance(n)`` reports ``n`` more units done."""

    def __init__(self, name: str, total: int) -> None:
        self.name = name
        self.total = int(total)
        self.done = 0
        self._callback = _CALLBACK.get()
        if self._callback is not None:
            self._callback(name, 0, self.total)

    def advance(self, count: int) -> None:
        if self._callback is None or count <= 0:
            return
        self.done = min(self.total, self.done + int(count))
        self._callback(self.name, self.done, self.total)

    def finish(self) -> None:
        """Report the whole stage done (a stage that ended early on a clean path, e.g. no entries)."""
        self.advance(self.total - self.done)
