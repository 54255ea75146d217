"""order="block": a keyed bijection at any position, one-number elastic state, and reads in runs (locality)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenloom.formats.errors import ConfigError, ResumeMismatchError
from tokenloom.sampler import ResumableDistributedSampler
from tokenloom.sampler._block import DEFAULT_BLOCK_SAMPLES, DEFAULT_WINDOW_BLOCKS, BlockOrder


def _order(n: int, seed: int = 0, epoch: int = 0, block: int = 16, window: int = 4) -> BlockOrder:
    return BlockOrder(n, seed=seed, epoch=epoch, block_samples=block, window_blocks=window)


#: any 64-bit seed
SEEDS = st.integers(0, 2**64 - 1)


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 3000), seed=SEEDS, epoch=st.integers(0, 3), block=st.integers(1, 200), window=st.integers(1, 12)
)
def test_a_bijection_for_any_n_seed_and_block_size(n, seed, epoch, block, window) -> None:
    order = _order(n, seed, epoch, block, window)
    indices = order(np.arange(n))
    assert np.array_equal(np.sort(indices), np.arange(n))  # N not a multiple of the block too
    # any position on its own (what a rank resuming anywhere computes) gives the same index
    probe = np.random.default_rng(seed % 1000).integers(0, n, size=min(n, 20))
    assert np.array_equal(order(probe), indices[probe])
    assert np.array_equal(_order(n, seed, epoch, block, window)(np.arange(n)), indices)  # deterministic


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 2000), block=st.integers(1, 64), window=st.integers(1, 8), seed=st.integers(0, 2**32))
def test_every_window_holds_whole_blocks(n, block, window, seed) -> None:
    order = _order(n, seed, 0, block, window)
    indices = order(np.arange(n))
    span = block * window
    for start in range(0, n, span):
        blocks = np.unique(indices[start : start + span] // block)
        taken = indices[start : start + span]
        # exactly the samples of those blocks: a window reads its blocks once, whole
        members = np.concatenate([np.arange(b * block, min((b + 1) * block, n)) for b in blocks])
        assert np.array_equal(np.sort(taken), members)
        assert len(blocks) <= window


def _fetched_per_used(indices: np.ndarray, sample_bytes: int, cache_block: int, window: int) -> float:
    """Bytes a reader fetches / bytes it uses, when its cache holds the blocks of ``window`` samples at a time."""
    fetched = 0
    for start in range(0, len(indices), window):
        taken = indices[start : start + window]
        first = taken * sample_bytes // cache_block
        last = ((taken + 1) * sample_bytes - 1) // cache_block
        touched = np.unique(np.concatenate([first, last]))
        fetched += len(touched) * cache_block
    return fetched / (len(indices) * sample_bytes)


@pytest.mark.parametrize("n", [300_000, 300_001, 2**19])
def test_fetched_bytes_per_used_byte_is_near_one_with_a_small_cache(n) -> None:
    sample_bytes, cache_block = 4098, 8 << 20  # 2,049-token uint16 windows, the remote layer's 8 MiB blocks
    block, window = DEFAULT_BLOCK_SAMPLES, DEFAULT_WINDOW_BLOCKS
    span = block * window  # the cache holds one window's blocks
    blocked = _fetched_per_used(_order(n, 7, 0, block, window)(np.arange(n)), sample_bytes, cache_block, span)
    feistel = ResumableDistributedSampler(n, 1, 0, seed=7).indices_at(np.arange(n))
    global_order = _fetched_per_used(feistel, sample_bytes, cache_block, span)
    assert blocked <= 1.15, blocked  # unaligned: a block of samples spans ~8 cache blocks and touches ~9
    assert global_order >= 2.5 * blocked, global_order  # each window touches nearly every block (n ~ 2-4 windows)


def test_aligned_blocks_fetch_each_byte_once() -> None:
    n, sample_bytes, cache_block = 40_960, 4096, 1 << 20  # a block of 256 samples is one 1 MiB cache block
    order = _order(n, 3, 0, block=256, window=4)(np.arange(n))
    assert _fetched_per_used(order, sample_bytes, cache_block, 256 * 4) == 1.0


def _elastic(n: int, seed: int, schedule: list[tuple[int, int]], **kwargs) -> list[int]:
    merged: list[int] = []
    state = None
    for number, (world, steps) in enumerate(schedule):
        samplers = [ResumableDistributedSampler(n, world, r, seed=seed, pad=False, **kwargs) for r in range(world)]
        for sampler in samplers:
            if state is not None:
                sampler.load_state_dict(state)
        last = number == len(schedule) - 1
        steps = max(len(s) for s in samplers) if last else min(steps, *(len(s) for s in samplers))
        iterators = [iter(s) for s in samplers]
        for _ in range(steps):
            merged += [v for v in (next(it, None) for it in iterators) if v is not None]
        if last:
            assert all(next(it, None) is None for it in iterators)
        states = [s.state_dict() for s in samplers]
        assert all(s == states[0] for s in states)
        state = states[0]
    return merged


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(0, 400),
    seed=SEEDS,
    block=st.integers(1, 40),
    window=st.integers(1, 6),
    schedule=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 50)), min_size=1, max_size=5),
)
def test_exactly_once_across_world_size_changes(n, seed, block, window, schedule) -> None:
    kwargs = {"order": "block", "block_samples": block, "window_blocks": window}
    single = list(ResumableDistributedSampler(n, 1, 0, seed=seed, **kwargs))
    assert sorted(single) == list(range(n))
    assert _elastic(n, seed, schedule, **kwargs) == single  # one global order, every index once


def test_state_is_one_number_plus_the_block_shape() -> None:
    sampler = ResumableDistributedSampler(1000, 2, 0, seed=1, order="block", block_samples=10, window_blocks=3)
    iterator = iter(sampler)
    for _ in range(5):
        next(iterator)
    state = sampler.state_dict()
    assert (state["order"], state["consumed"], state["block_samples"], state["window_blocks"]) == ("block", 10, 10, 3)
    with pytest.raises(ResumeMismatchError, match="block_samples: saved 10, this sampler 20"):
        ResumableDistributedSampler(
            1000, 3, 1, seed=1, order="block", block_samples=20, window_blocks=3
        ).load_state_dict(state)
    feistel = ResumableDistributedSampler(1000, 1, 0, seed=1).state_dict()
    assert "block_samples" not in feistel  # states of the other orders are unchanged
    defaults = ResumableDistributedSampler(10, 1, 0, order="block").state_dict()
    assert (defaults["block_samples"], defaults["window_blocks"]) == (DEFAULT_BLOCK_SAMPLES, DEFAULT_WINDOW_BLOCKS)


def test_block_options_need_the_block_order() -> None:
    with pytest.raises(ConfigError, match="block_samples is set but order is 'feistel'"):
        ResumableDistributedSampler(100, 1, 0, block_samples=8)
    with pytest.raises(ConfigError, match="window_blocks is 0, expected an integer"):
        ResumableDistributedSampler(100, 1, 0, order="block", window_blocks=0)
