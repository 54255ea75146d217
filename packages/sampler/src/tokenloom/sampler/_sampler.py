"""ResumableDistributedSampler: one global order per epoch, sliced across whatever ranks exist now."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from tokenloom.formats.errors import ConfigError
from tokenloom.sampler._block import check_block_options
from tokenloom.sampler._config import check_choice, check_int, dataset_length, world
from tokenloom.sampler._identity import (
    DATA_FINGERPRINT_KEY,
    DATA_OBJECTS_KEY,
    check_data_fingerprint,
    check_epoch,
    data_fingerprint,
    data_objects,
)
from tokenloom.sampler._order import EpochOrder, Order, epoch_order
from tokenloom.sampler._plan import RankPlan, Tail, plan_rank
from tokenloom.sampler._state import SamplerIdentity, check_state, make_state

__all__ = ["ResumableDistributedSampler"]

logger = logging.getLogger("tokenloom.sampler")

_SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts
_CHUNK = 8192


class ResumableDistributedSampler(Sampler[int]):
    """Distributed sampler whose epoch order depends on (seed, epoch, N) only.

    Rank ``r`` of ``W`` takes global positions ``r, r + W, ...`` of the epoch order,
    counted from the resume point. The resume state records the *global* number of
    samples consumed, so :meth:`load_state_dict` on any number of replicas continues
    the same order with nothing repeated or skipped. Ranks are assumed to step in
    lock-step (data parallel training), so every rank's state is the same.

    Args:
        dataset_or_length: a map-style dataset (its ``len``) or N itself.
        num_replicas, rank: default to torch.distributed's when it is initialised, else 1 and 0.
        shuffle: False keeps the dataset order (still sliced and resumable).
        seed: with the epoch, keys the order; taken modulo 2**64 for ``order="feistel"``.
        drop_last: drop the tail that does not divide by the world size (reported).
        pad: with drop_last False, repeat the epoch's first indices so every rank yields
            the same count (reported); False gives exact evaluation: no duplicates,
            counts differ by at most one.
        order: ``"feistel"`` (O(1) memory; the default, for local disks), ``"block"`` (O(1) memory,
            reads in runs: data in object storage) or ``"torch"`` (torch.randperm(N) seeded with
            seed + epoch, as DistributedSampler; O(N) memory).
        block_samples, window_blocks: ``order="block"`` only: consecutive samples per block (default
            2048) and blocks shuffled together (default 8); see the README.
        start_epoch, start_iter: resume as the seed system does: ``start_iter`` samples
            already yielded by each of the ``num_replicas`` ranks in ``start_epoch``.
        allow_missing_data_fingerprint: accept in :meth:`load_state_dict` a state that records no
            dataset fingerprint although this dataset has one (a state saved from a plain length or
            by a version before the fingerprint was recorded). Default False: such a state is refused
            with ResumeMismatchError, since it could belong to any dataset of the same length.
    """

    def __init__(
        self,
        dataset_or_length: object,
        num_replicas: int | None = None,
        rank: int | None = None,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        pad: bool = True,
        order: Order | str = Order.FEISTEL,
        start_epoch: int = 0,
        start_iter: int = 0,
        allow_missing_data_fingerprint: bool = False,
        block_samples: int | None = None,
        window_blocks: int | None = None,
    ) -> None:
        n = dataset_length(dataset_or_length)
        self._allow_missing_data_fingerprint = bool(allow_missing_data_fingerprint)
        self._data_fingerprint = data_fingerprint(dataset_or_length)
        self._data_objects = data_objects(dataset_or_length)
        self.num_replicas, self.rank = world(num_replicas, rank)
        mode = check_choice("order", order, Order)
        if drop_last and not pad:
            raise ConfigError(
                "drop_last=True with pad=False: drop_last already avoids padding",
                field="pad",
                hint="Use drop_last=True (drop the tail) or pad=False (exact evaluation), not both",
            )
        block, window = check_block_options(mode.value, block_samples, window_blocks)
        self._identity = SamplerIdentity(
            n=n,
            seed=check_int("seed", seed, *_SEED_RANGE),
            order=mode.value,
            shuffle=bool(shuffle),
            drop_last=bool(drop_last),
            pad=bool(pad),
            block_samples=block,
            window_blocks=window,
        )
        self._tail = Tail.DROP if drop_last else Tail.PAD if pad else Tail.EXACT
        self._epoch = check_epoch("start_epoch", start_epoch)
        epoch_start = plan_rank(n, 0, self.num_replicas, 0, self._tail)
        start_iter = check_int("start_iter", start_iter, 0, epoch_start.count)
        self._start = epoch_start.consumed_after(start_iter, self._tail)
        self._yielded = 0  # by this rank since self._start
        self._generation = 0  # bumped whenever the cursor moves under a live iterator
        self._order_cache: tuple[int, EpochOrder] | None = None

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def consumed(self) -> int:
        """Global samples of this epoch consumed so far (all ranks, in lock-step)."""
        return self._plan().consumed_after(self._yielded, self._tail)

    @property
    def num_padded(self) -> int:
        """Repeated positions at the end of this epoch (over all ranks) at this world size."""
        return self._plan().padded

    @property
    def num_dropped(self) -> int:
        """Indices of this epoch no rank yields (drop_last) at this world size."""
        return self._plan().dropped

    def __len__(self) -> int:
        """Samples this rank still yields in the current epoch."""
        return self._plan().count - self._yielded

    def set_epoch(self, epoch: int) -> None:
        """Move to ``epoch`` from its start; the current epoch keeps its position (resume-safe)."""
        epoch = check_epoch("epoch", epoch)
        if epoch != self._epoch:
            self._move(epoch, 0)

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON: epoch, global consumed position, what the order is made of, a fingerprint."""
        state = make_state(self._identity, epoch=self._epoch, consumed=self.consumed)
        if self._data_fingerprint is not None:
            state[DATA_FINGERPRINT_KEY] = self._data_fingerprint
        if self._data_objects:
            state[DATA_OBJECTS_KEY] = dict(self._data_objects)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` on this sampler's world size; ResumeMismatchError if foreign."""
        epoch, consumed = check_state(state, self._identity)
        check_data_fingerprint(
            state,
            self._data_fingerprint,
            allow_missing=self._allow_missing_data_fingerprint,
            objects=self._data_objects,
        )
        check_epoch("epoch", epoch)
        self._move(epoch, consumed)

    def indices_at(self, positions: np.ndarray, epoch: int | None = None) -> np.ndarray:
        """Dataset indices at global ``positions`` of an epoch's order (a pure look-up)."""
        order = self._order_for(self._epoch if epoch is None else check_epoch("epoch", epoch))
        return order(np.asarray(positions, dtype=np.int64))

    def __iter__(self) -> Iterator[int]:
        return self._walk(_CHUNK, per_sample=True)

    def iter_chunks(self, chunk_size: int = 65536) -> Iterator[np.ndarray]:
        """This rank's indices as int64 arrays: the fast path for batch builders and benchmarks."""
        return self._walk(check_int("chunk_size", chunk_size, 1), per_sample=False)

    def _plan(self) -> RankPlan:
        return plan_rank(self._identity.n, self._start, self.num_replicas, self.rank, self._tail)

    def _move(self, epoch: int, consumed: int) -> None:
        self._epoch, self._start, self._yielded = epoch, consumed, 0
        self._generation += 1

    def _order_for(self, epoch: int) -> EpochOrder:
        if self._order_cache is None or self._order_cache[0] != epoch:
            identity = self._identity
            order = epoch_order(
                identity.n,
                seed=identity.seed,
                epoch=epoch,
                order=Order(identity.order),
                shuffle=identity.shuffle,
                block_samples=identity.block_samples,
                window_blocks=identity.window_blocks,
            )
            self._order_cache = (epoch, order)
        return self._order_cache[1]

    def _walk(self, chunk_size: int, *, per_sample: bool) -> Iterator[Any]:
        # A generator: nothing below runs until the first next(), so an iterator made
        # before load_state_dict (as DataLoaders do) still starts from the loaded state.
        self._generation += 1
        token = self._generation
        plan, order = self._plan(), self._order_for(self._epoch)
        if self._yielded == 0 and (plan.padded or plan.dropped):
            logger.info(
                "epoch %d from position %d on %d replicas: %d padded, %d dropped",
                self._epoch, plan.start, plan.num_replicas, plan.padded, plan.dropped,
            )  # fmt: skip
        while self._yielded < plan.count:
            first = self._yielded
            indices = order(plan.positions(first, min(first + chunk_size, plan.count)))
            if not per_sample:
                self._check_current(token)
                self._yielded = first + len(indices)
                yield indices
                continue
            for index in indices.tolist():
                self._check_current(token)
                self._yielded += 1  # before the yield: a snapshot taken now includes it
                yield index
        self._check_current(token)
        self._move(self._epoch + 1, 0)  # as the seed system: a finished epoch moves on

    def _check_current(self, token: int) -> None:
        if token != self._generation:
            raise RuntimeError(
                "this sampler iterator was superseded (a newer iter(sampler), set_epoch or "
                "load_state_dict moved the position); iterate the newest iterator"
            )
