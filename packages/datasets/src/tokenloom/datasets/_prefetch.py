"""``dataset.prefetch(sampler, ...)``: each reader fetches the blocks of its own next samples ahead of use.

The sampler's order is a bijection, so the index at every future position of this rank is known; a
DataLoader deals batch ``k`` of the rank's stream to worker ``k mod num_workers``, so each worker knows
its own share too. In each process that reads (the main process, or every worker) a background thread
(:class:`tokenloom.formats.remote.prefetch.BlockPrefetcher`) keeps the blocks of that process's next
``lookahead`` samples in the node's cache and publishes them as the forecast the cache's Belady
eviction reads. Local shards need nothing: there prefetch is a no-op.

:class:`PrefetchFromSampler` is that machinery for any map-style dataset that can name the cache blocks
each sample reads (:meth:`~PrefetchFromSampler.blocks_of`) and its remote caches
(:meth:`~PrefetchFromSampler.remote_caches`); :class:`Prefetching` names them for a dataset over a token
stream, and a dataset over other datasets (a curriculum) asks its parts.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np
from torch.utils.data import get_worker_info

from tokenloom.datasets._byte_ranges import SampleBytes, block_array
from tokenloom.datasets._window_index import check_positive
from tokenloom.formats import ConfigError

__all__ = ["DEFAULT_LOOKAHEAD", "PrefetchFromSampler", "Prefetching"]

log = logging.getLogger("tokenloom.datasets")

#: samples each reader fetches ahead unless ``lookahead=`` says otherwise
DEFAULT_LOOKAHEAD = 256
_CHUNK = 4096


@dataclass(frozen=True, slots=True)
class _Spec:
    sampler: Any
    batch_size: int
    lookahead: int


class _ProcessLocal:
    """Holds a value in the process that made it; a pickled or forked copy holds nothing."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.value: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()

    def get(self) -> Any:
        return self.value if self.pid == os.getpid() else None


def share_schedule(
    sampler: Any, n: int, *, consumed: int, remaining: int, batch_size: int, worker: int, num_workers: int
) -> Iterator[int]:
    """Dataset indices one DataLoader worker reads, in order, from global position ``consumed`` on."""
    replicas, rank, epoch = sampler.num_replicas, sampler.rank, sampler.epoch
    first = 0
    while True:
        local = np.arange(first, first + _CHUNK, dtype=np.int64)
        step = (worker + num_workers * (local // batch_size)) * batch_size + local % batch_size
        step = step[step < remaining]
        if len(step) == 0:
            return
        positions = consumed + rank + step * replicas
        beyond = positions >= n
        positions[beyond] = (positions[beyond] - n) % n  # the padded tail repeats the epoch's start
        yield from sampler.indices_at(positions, epoch).tolist()
        first += _CHUNK


class PrefetchFromSampler:
    """Mixin: :meth:`prefetch` and the hook the dataset's reads call (``_prefetch_consumed``).

    A dataset using it has ``len`` (the sampler's ``n``), names the blocks of its samples
    (:meth:`blocks_of`) and its remote caches (:meth:`remote_caches`), and calls
    ``self._prefetch_consumed(indices)`` from ``__getitem__``/``__getitems__`` while ``_prefetch_spec`` is set.
    """

    _prefetch_spec: _Spec | None = None
    _prefetch_live: _ProcessLocal | None = None

    def prefetch(
        self, sampler: Any, *, batch_size: int = 1, lookahead: int = DEFAULT_LOOKAHEAD, num_workers: int | None = None
    ) -> Any:
        """Fetch the blocks of each reader's next ``lookahead`` samples of ``sampler`` ahead of use; returns self.

        ``sampler`` is the :class:`~tokenloom.sampler.ResumableDistributedSampler` the DataLoader iterates
        with ``batch_size``. With ``num_workers`` (the DataLoader's) a ``cache_limit`` too small for the
        blocks in flight is a ConfigError here; otherwise at the first batch of each worker.
        """
        for name in ("indices_at", "consumed", "num_replicas", "rank", "epoch"):
            if not hasattr(sampler, name):
                raise ConfigError(
                    f"prefetch needs a sampler whose future order is known; {type(sampler).__name__} has no {name!r}",
                    field="sampler",
                    hint="Use tokenloom.sampler.ResumableDistributedSampler",
                )
        spec = _Spec(sampler, check_positive(batch_size, "batch_size"), check_positive(lookahead, "lookahead"))
        if num_workers is not None:  # checked before the dataset takes the spec: a refusal leaves it as it was
            workers = max(1, int(num_workers))
            self._check_limits(self._prefetch_schedule(spec, 0, 1, already=0), spec.lookahead, workers)
        self._prefetch_spec = spec
        self._prefetch_live = _ProcessLocal()
        return self

    def blocks_of(self, indices: list[int]) -> list[list[tuple[Any, Any, int]]]:
        """``(cache, object, block number)`` of every cache block each sample of ``indices`` reads ([] on disk)."""
        raise NotImplementedError

    def remote_caches(self) -> list[Any]:
        """The block caches of this dataset's remote data; none: prefetch has nothing to do."""
        raise NotImplementedError

    def _prefetch_schedule(self, spec: _Spec, worker: int, num_workers: int, *, already: int) -> Iterator[int]:
        sampler = spec.sampler
        return share_schedule(
            sampler,
            len(self),  # pyright: ignore[reportArgumentType]
            consumed=sampler.consumed - already * sampler.num_replicas,
            remaining=len(sampler) + already,
            batch_size=spec.batch_size,
            worker=worker,
            num_workers=num_workers,
        )

    def _check_limits(self, schedule: Iterator[int], lookahead: int, num_workers: int) -> None:
        """ConfigError when a cache limit cannot hold the blocks in flight of the job's readers on this node.

        The readers are what the job runs (ranks on the node x ``num_workers``, :func:`budget.planned_readers`),
        not the ones that registered so far: the same job is refused, or not, every time.
        """
        from tokenloom.formats.remote import budget

        per_root: dict[Any, tuple[Any, set]] = {}  # one node cache may serve several datasets (a curriculum's buckets)
        for blocks_of_index in self.blocks_of(list(islice(schedule, lookahead))):
            for cache, obj, number in blocks_of_index:
                per_root.setdefault(cache.root, (cache, set()))[1].add((obj.url, number))
        for cache, blocks in per_root.values():
            if cache.limit is None:
                continue
            others = {r["pid"] for r in budget.live_readers(cache.root)} - {os.getpid()}  # more than planned: counted
            budget.check_limit(
                cache.limit,
                cache.block_size,
                readers=budget.floor_readers(len(others), num_workers),
                lookahead_blocks=len(blocks),
                where=f" of {cache.root} (lookahead {lookahead} samples)",
            )

    def _prefetch_consumed(self, indices: Sequence[int]) -> None:
        """The reader took ``indices``: start this process's prefetcher on first use, then move it on."""
        spec, live = self._prefetch_spec, self._prefetch_live
        if spec is None or live is None:
            return
        prefetcher = live.get()
        if prefetcher is False:
            return  # nothing remote to prefetch in this process
        if prefetcher is None:
            live.pid, live.value = os.getpid(), False
            info = get_worker_info()
            worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
            already = 0 if info is not None else len(indices)  # the main process's sampler counted this batch
            caches = self.remote_caches()
            if not caches:
                return
            from tokenloom.formats.remote.prefetch import BlockPrefetcher

            self._check_limits(
                self._prefetch_schedule(spec, worker, num_workers, already=already), spec.lookahead, num_workers
            )
            schedule = self._prefetch_schedule(spec, worker, num_workers, already=already)
            prefetcher = live.value = BlockPrefetcher(schedule, self.blocks_of, spec.lookahead)
        prefetcher.consumed(indices)

    @property
    def prefetcher(self) -> Any:
        """This process's :class:`~tokenloom.formats.remote.prefetch.BlockPrefetcher` (None before the first read)."""
        live = self._prefetch_live
        value = live.get() if live is not None else None
        return value or None


class Prefetching(PrefetchFromSampler, SampleBytes):
    """:class:`PrefetchFromSampler` for a dataset over a token stream: a sample's blocks from its byte ranges."""

    def _remote_blocks(self, index: int) -> list[tuple[Any, Any, int]]:
        blocks = []
        for shard, start, end in self.byte_ranges(index):
            array = block_array(self._stream.shards[shard])
            if array is None or end <= start:
                continue
            size = array.cache.block_size
            blocks += [(array.cache, array.obj, number) for number in range(start // size, (end - 1) // size + 1)]
        return blocks

    def blocks_of(self, indices: list[int]) -> list[list[tuple[Any, Any, int]]]:
        """The blocks of each of ``indices`` (vectorised for windows that stay in one shard)."""
        starts = getattr(self, "_sample_starts_np", None)
        if starts is None or getattr(self, "cross_shard", True):
            return [self._remote_blocks(index) for index in indices]
        index = np.asarray(indices, dtype=np.int64)
        shards = self._stream.shards
        arrays = [block_array(s) for s in shards]
        item = np.asarray([s.dtype.itemsize for s in shards], dtype=np.int64)
        base = np.asarray([a.byte_offset if a is not None else 0 for a in arrays], dtype=np.int64)
        size = np.asarray([a.cache.block_size if a is not None else 1 for a in arrays], dtype=np.int64)
        shard = np.searchsorted(starts, index, side="right") - 1
        start = base[shard] + (index - starts[shard]) * self.stride * item[shard]  # pyright: ignore[reportAttributeAccessIssue]
        end = start + (self.seq_len + 1) * item[shard]  # pyright: ignore[reportAttributeAccessIssue]
        first, last = start // size[shard], (end - 1) // size[shard]
        blocks = []
        for k, lo, hi in zip(shard.tolist(), first.tolist(), last.tolist(), strict=True):
            array = arrays[k]
            blocks.append([] if array is None else [(array.cache, array.obj, n) for n in range(lo, hi + 1)])
        return blocks

    def remote_caches(self) -> list[Any]:
        return [array.cache for array in (block_array(s) for s in self._stream.shards) if array is not None]
