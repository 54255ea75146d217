"""Read ahead: a unit's blocks are read and parsed in a background thread while the slot tokenizes.

A remote read waits on the network; tokenization (Rust, outside the GIL) does not need the reader. So
each unit's reader runs in a daemon thread up to ``depth`` blocks ahead of the consumer, and the
slot starts its next unit's reader before the current one ends. What is read ahead is never part of
the saved state (the state is the position of the last emitted window), so read-ahead changes
timing, never the stream's bytes. Errors reach the consumer in order, after the blocks before them.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["ReadAhead"]

T = TypeVar("T")
_ITEM, _END, _ERROR = 0, 1, 2


class ReadAhead(Generic[T]):
    """Iterate ``make()`` in a daemon thread, at most ``depth`` items ahead (``depth`` 0: in the caller)."""

    def __init__(self, make: Callable[[], Iterator[T]], depth: int) -> None:
        self._make = make
        self._stop = threading.Event()
        self._queue: queue.Queue[tuple[int, object]] = queue.Queue(maxsize=max(1, depth))
        self._thread: threading.Thread | None = None
        if depth > 0:
            self._thread = threading.Thread(target=self._run, name="tokenloom-read-ahead", daemon=True)
            self._thread.start()

    def _put(self, entry: tuple[int, object]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            iterator = self._make()
            try:
                for item in iterator:
                    if not self._put((_ITEM, item)):
                        return
            finally:
                close = getattr(iterator, "close", None)
                if close is not None:
                    close()
            self._put((_END, None))
        except BaseException as exc:  # handed to the consumer, raised there in order
            self._put((_ERROR, exc))

    def __iter__(self) -> Iterator[T]:
        if self._thread is None:
            yield from self._make()
            return
        try:
            while True:
                kind, value = self._queue.get()
                if kind == _END:
                    return
                if kind == _ERROR:
                    assert isinstance(value, BaseException)  # noqa: S101 - put by _run
                    raise value
                yield value  # type: ignore[misc]
        finally:
            self.close()

    def close(self) -> None:
        """Stop the thread (it closes its reader); unread blocks are dropped."""
        self._stop.set()
