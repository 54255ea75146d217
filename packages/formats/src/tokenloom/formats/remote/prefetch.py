"""A background fetcher: the blocks of a reader's next ``lookahead`` samples are in the cache before they are read.

The reader knows its future (the sampler's order is a bijection: every future position's index is
computable), so this is not a guess: ``schedule`` yields the sample indices this process will read, in
order, and ``blocks_of(index)`` says which blocks each needs. A daemon thread keeps the next
``lookahead`` samples' blocks fetched, in order of use, and publishes them with their positions (the
readers' forecast the evictor reads, :mod:`.budget`). The reader reports what it consumed
(:meth:`BlockPrefetcher.consumed`); indices that differ from the schedule switch prefetching off (logged):
prefetch only ever saves time, the reader fetches whatever is missing itself.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice

from tokenloom.formats.remote import budget
from tokenloom.formats.remote.cache import BlockCache
from tokenloom.formats.remote.client import ObjectInfo

__all__ = ["DEFAULT_LOOKAHEAD", "BlockPrefetcher", "BlockRef"]

log = logging.getLogger("tokenloom.formats.remote")

#: samples fetched ahead of the reader unless ``lookahead=`` says otherwise
DEFAULT_LOOKAHEAD = 256

BlockRef = tuple[BlockCache, ObjectInfo, int]


class BlockPrefetcher:
    """Fetches the blocks of the next ``lookahead`` samples of ``schedule`` in a daemon thread."""

    def __init__(
        self, schedule: Iterable[int], blocks_of: Callable[[int], Sequence[BlockRef]], lookahead: int
    ) -> None:
        self.lookahead = lookahead
        self._schedule: Iterator[int] = iter(schedule)
        self._blocks_of = blocks_of
        self._window: deque[tuple[int, int, Sequence[BlockRef]]] = deque()  # (position, index, blocks)
        self._next_position = 0
        self._cursor = 0
        self._closed = False
        self._exhausted = False
        self._cond = threading.Condition()
        self._roots: set = set()
        #: blocks this thread fetched (GETs issued) and samples whose blocks were all ready in time
        self.fetched = 0
        self._thread = threading.Thread(target=self._run, name="tokenloom-prefetch", daemon=True)
        self._thread.start()

    @property
    def active(self) -> bool:
        return not self._closed

    def consumed(self, indices: Sequence[int]) -> None:
        """The reader took these samples (in order): move the window on, check them against the schedule."""
        with self._cond:
            if self._closed:
                return
            first = self._window[0][0] if self._window else 0
            for offset, index in enumerate(indices):
                slot = self._cursor + offset - first
                if 0 <= slot < len(self._window) and self._window[slot][1] != int(index):
                    log.warning(
                        "prefetch: the reader asked for sample %d where its sampler's order has %d; prefetching "
                        "stops (the loader is not iterating the sampler given to prefetch(), or a persistent "
                        "worker moved to another epoch)",
                        int(index),
                        self._window[slot][1],
                    )
                    self._close_locked()
                    return
            self._cursor += len(indices)
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._close_locked()

    def _close_locked(self) -> None:
        self._closed = True
        self._cond.notify_all()
        for root in self._roots:
            budget.withdraw_needs(root)

    def _refill(self) -> bool:
        """Wait until the reader moved on, then extend the window; False once closed."""
        step = max(1, self.lookahead // 8)
        with self._cond:
            while not self._closed and (self._exhausted or self._next_position - self._cursor > self.lookahead - step):
                self._cond.wait()
            if self._closed:
                return False
            while self._window and self._window[0][0] < self._cursor:
                self._window.popleft()
            want = self._cursor + self.lookahead - self._next_position
        fresh = []
        for index in islice(self._schedule, max(0, want)):
            fresh.append((self._next_position + len(fresh), index, self._blocks_of(index)))
        with self._cond:
            self._window.extend(fresh)
            self._next_position += len(fresh)
            self._exhausted = len(fresh) < want
            cursor, window = self._cursor, list(self._window)
        self._publish(cursor, window)
        return True

    def _publish(self, cursor: int, window: list[tuple[int, int, Sequence[BlockRef]]]) -> None:
        needs: dict = {}
        counts: dict = {}
        for position, _, blocks in window:
            for cache, obj, number in blocks:
                per_root = needs.setdefault(cache.root, {})
                key = cache.block_key(obj, number)
                if key not in per_root:
                    per_root[key] = position
                    counts[cache.root] = counts.get(cache.root, 0) + 1
        for root, per_root in needs.items():
            self._roots.add(root)
            budget.publish_needs(root, cursor, per_root, counts[root])

    def _run(self) -> None:
        ensured = 0  # samples before this position had their blocks fetched
        try:
            while self._refill():
                with self._cond:
                    window = [entry for entry in self._window if entry[0] >= max(self._cursor, ensured)]
                for position, _, blocks in window:
                    ensured = position + 1
                    if self._closed:
                        return
                    for cache, obj, number in blocks:
                        self.fetched += cache.ensure(obj, number)
        except Exception as exc:  # prefetch only saves time: the reader fetches (and reports) by itself
            log.warning("prefetch stopped: %s", exc)
            self.close()
