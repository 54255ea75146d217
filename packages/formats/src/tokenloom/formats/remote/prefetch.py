"""A background fetcher: the blocks of a reader's next ``lookahead`` samples are in the cache before they are read.

The reader knows its future (the sampler's order is a bijection: every future position's index is
computable), so this is not a guess: ``schedule`` yields the sample indices this process will read, in
order, and ``blocks_of(indices)`` says which blocks each needs. A daemon thread keeps the next
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
        self,
        schedule: Iterable[int],
        blocks_of: Callable[[list[int]], Sequence[Sequence[BlockRef]]],
        lookahead: int,
    ) -> None:
        self.lookahead = lookahead
        self._schedule: Iterator[int] = iter(schedule)
        self._blocks_of = blocks_of
        self._window: deque[tuple[int, int, Sequence[BlockRef], list]] = deque()  # (position, index, blocks, keys)
        self._next_position = 0
        self._cursor = 0
        self._closed = False
        self._exhausted = False
        self._cond = threading.Condition()
        self._roots: set = set()
        self._limited_roots: set = set()  # roots of caches with a limit: the only ones whose evictor reads needs
        self._keys: dict = {}  # (cache, object, block) -> (cache root, block key): strings built once
        self._fetched_keys: set = set()  # blocks this thread saw in the cache or put there
        self._wake_at = 0  # the cursor at which the thread has work again
        self._published: dict = {}  # what the readers' record holds now, per cache root
        self._published_cursor = 0
        #: blocks this thread fetched (GETs issued) and samples whose blocks were all ready in time
        self.fetched = 0
        self._thread = threading.Thread(target=self._run, name="tokenloom-prefetch", daemon=True)
        self._thread.start()

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
            if self._cursor >= self._wake_at:
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
                self._wake_at = self._next_position - self.lookahead + step
                self._cond.wait()
            if self._closed:
                return False
            while self._window and self._window[0][0] < self._cursor:
                self._window.popleft()
            want = self._cursor + self.lookahead - self._next_position
        fresh = []
        indices = list(islice(self._schedule, max(0, want)))
        for index, blocks in zip(indices, self._blocks_of(indices) if indices else [], strict=True):
            keys = []
            for cache, obj, number in blocks:
                memo = (id(cache), obj.url, number)
                key = self._keys.get(memo)
                if key is None:
                    key = self._keys[memo] = (cache.root, cache.block_key(obj, number))
                    if cache.limit is not None:
                        self._limited_roots.add(cache.root)
                keys.append(key)
            fresh.append((self._next_position + len(fresh), index, blocks, keys))
        with self._cond:
            self._window.extend(fresh)
            self._next_position += len(fresh)
            self._exhausted = len(fresh) < want
            cursor, window = self._cursor, list(self._window)
        self._publish(cursor, window)
        return True

    def _publish(self, cursor: int, window: list[tuple[int, int, Sequence[BlockRef], list]]) -> None:
        if not self._limited_roots:
            return
        needs: dict = {}
        for position, _, _, keys in window:
            for root, key in keys:
                if root in self._limited_roots:
                    needs.setdefault(root, {}).setdefault(key, position)
        # a write costs about a millisecond: skip it while few new blocks entered the window (an eighth of
        # it, or none while nothing was ever published) and the published positions are under a quarter
        # of a window old: the eviction order barely changes meanwhile
        fresh = sum(key not in self._published.get(root, ()) for root, per_root in needs.items() for key in per_root)
        total = sum(len(per_root) for per_root in needs.values())
        if (fresh == 0 or (self._published and fresh * 8 < total)) and cursor - self._published_cursor < max(
            1, self.lookahead // 4
        ):
            return
        for root, per_root in needs.items():
            self._roots.add(root)
            budget.publish_needs(root, cursor, per_root, len(per_root))
        self._published, self._published_cursor = needs, cursor

    def _run(self) -> None:
        ensured = 0  # samples before this position had their blocks fetched
        try:
            while self._refill():
                with self._cond:
                    window = [entry for entry in self._window if entry[0] >= max(self._cursor, ensured)]
                for position, _, blocks, keys in window:
                    ensured = position + 1
                    if self._closed:
                        return
                    for (cache, obj, number), key in zip(blocks, keys, strict=True):
                        if key not in self._fetched_keys or cache.limit is not None:
                            self.fetched += cache.ensure(obj, number)
                            self._fetched_keys.add(key)
        except Exception as exc:  # prefetch only saves time: the reader fetches (and reports) by itself
            log.warning("prefetch stopped: %s", exc)
            self.close()
