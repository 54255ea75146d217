"""The blocked, in-place Feistel gives every index the original implementation gave (saved states resume).

The reference below is the implementation before the speed-up, kept verbatim: a whole-array network
that splits and joins the halves every round, cycle-walking on fancy-indexed copies, and the rank's
positions as ``start + rank + steps * world``. Every comparison is bit for bit, dtype included.
"""

from __future__ import annotations

import math
from fractions import Fraction
from unittest import mock

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tokenloom.sampler import ResumableDistributedSampler, _block
from tokenloom.sampler._block import BlockOrder
from tokenloom.sampler._config import MAX_LENGTH
from tokenloom.sampler._feistel import _BLOCK, FeistelPermutation, round_keys
from tokenloom.sampler._plan import Tail, plan_rank

_FMIX_C1 = np.uint64(0xFF51AFD7ED558CCD)
_FMIX_C2 = np.uint64(0xC4CEB9FE1A85EC53)
_SHIFT33 = np.uint64(33)


def _reference_fmix64(values: np.ndarray) -> np.ndarray:
    values ^= values >> _SHIFT33
    values *= _FMIX_C1
    values ^= values >> _SHIFT33
    values *= _FMIX_C2
    values ^= values >> _SHIFT33
    return values


class ReferencePermutation:
    """FeistelPermutation as it was (tokenloom 0.1.0 up to this change)."""

    def __init__(self, n: int, keys: tuple[int, ...]) -> None:
        self._n = n
        self._bits = max(2, (n - 1).bit_length())
        self._left_bits = self._bits // 2
        self._keys = tuple(np.uint64(k) for k in keys)

    def _network(self, values: np.ndarray) -> np.ndarray:
        left_bits, right_bits = self._left_bits, self._bits - self._left_bits
        for key in self._keys:
            right_mask = np.uint64((1 << right_bits) - 1)
            left = values >> np.uint64(right_bits)
            right = values & right_mask
            mixed = _reference_fmix64(right + key)
            mixed &= np.uint64((1 << left_bits) - 1)
            left ^= mixed
            right <<= np.uint64(left_bits)
            values = right | left
            left_bits, right_bits = right_bits, left_bits
        return values

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        values = self._network(positions.astype(np.uint64))
        limit = np.uint64(self._n)
        walking = np.flatnonzero(values >= limit)
        while walking.size:
            stepped = self._network(values[walking])
            values[walking] = stepped
            walking = walking[stepped >= limit]
        return values.astype(np.int64)


def _reference_positions(plan, first: int, stop: int) -> np.ndarray:
    steps = np.arange(first, stop, dtype=np.int64)
    positions = plan.start + plan.rank + steps * plan.num_replicas
    if plan.padded:
        beyond = positions >= plan.n
        positions[beyond] = (positions[beyond] - plan.n) % plan.n
    return positions


def sizes(top: int = MAX_LENGTH) -> st.SearchStrategy[int]:
    """N: tiny, 2**k - 2 .. 2**k + 2 (bit-length edges), anything, and the benchmark's sizes."""
    near_power = st.builds(lambda k, d: 2**k + d, st.integers(1, top.bit_length() - 1), st.integers(-2, 2))
    return st.one_of(
        st.integers(1, 70),
        near_power.filter(lambda n: 1 <= n <= top),
        st.integers(1, top),
        st.sampled_from([10**8, 10**10]),
    )


def _same(new: np.ndarray, old: np.ndarray) -> None:
    assert new.dtype == old.dtype == np.int64
    assert new.shape == old.shape
    assert np.array_equal(new, old)


@settings(max_examples=300, deadline=None)
@given(
    n=sizes(2**63 - 1),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 2**32 - 1),
    rounds=st.sampled_from([2, 4, 6, 8]),
    count=st.one_of(st.integers(0, 40), st.sampled_from([_BLOCK - 1, _BLOCK, _BLOCK + 1]), st.integers(0, 3 * _BLOCK)),
    draw=st.integers(0, 2**32),
)
@example(n=10**10, seed=1, epoch=0, rounds=6, count=65536, draw=0)
@example(n=2**62 + 1, seed=2**64 - 1, epoch=2**32 - 1, rounds=6, count=5000, draw=1)
def test_the_permutation_equals_the_reference(n, seed, epoch, rounds, count, draw) -> None:
    keys = round_keys(seed, epoch, rounds)
    rng = np.random.default_rng(draw)
    positions = np.arange(n, dtype=np.int64) if n <= count else rng.integers(0, n, size=count, dtype=np.int64)
    if count and n > count:
        positions[: min(2, count)] = [0, n - 1][: min(2, count)]  # both ends of the domain
    _same(FeistelPermutation(n, keys)(positions), ReferencePermutation(n, keys)(positions))


@settings(max_examples=150, deadline=None)
@given(
    n=sizes(),
    world=st.integers(1, 9),
    rank_draw=st.integers(0, 8),
    seed=st.integers(-(2**63), 2**64 - 1),
    epoch=st.integers(0, 2**32 - 1),
    tail=st.sampled_from(["pad", "drop", "exact"]),
    resume=st.one_of(st.just(0.0), st.just(1.0), st.floats(0, 1), st.floats(0.999, 1)),
    chunk=st.one_of(st.integers(1, 50), st.integers(1, 70000), st.just(65536)),
)
@example(n=2**54 - 1, world=1, rank_draw=0, seed=0, epoch=0, tail="pad", resume=1.0, chunk=65536)
def test_the_sampler_yields_the_reference_chunks(n, world, rank_draw, seed, epoch, tail, resume, chunk) -> None:
    kwargs = {"pad": {}, "drop": {"drop_last": True}, "exact": {"pad": False}}[tail]
    epoch_start = plan_rank(n, 0, world, 0, Tail(tail))
    # exact: int(1.0 * (2**54 - 1)) rounds up to 2**54, past the end the sampler rightly refuses
    start_iter = math.floor(Fraction(resume) * epoch_start.count)
    rank = rank_draw % world
    sampler = ResumableDistributedSampler(n, world, rank, seed=seed, start_epoch=epoch, start_iter=start_iter, **kwargs)
    plan = plan_rank(n, epoch_start.consumed_after(start_iter, Tail(tail)), world, rank, Tail(tail))
    reference = ReferencePermutation(n, round_keys(seed, epoch)) if n > 1 else None
    first = 0
    for number, got in enumerate(sampler.iter_chunks(chunk)):
        stop = min(first + chunk, plan.count)
        positions = _reference_positions(plan, first, stop)
        _same(got, positions if reference is None else reference(positions))
        first = stop
        if number == 5 or first >= 100_000:
            break
    else:
        assert first == plan.count


@st.composite
def block_cases(draw: st.DrawFn) -> tuple[int, int, int, np.ndarray]:
    """(n, block, window, positions): at most ~40 windows touched, so that an example stays fast."""
    block = draw(st.one_of(st.integers(1, 300), st.just(16384)))
    window = draw(st.one_of(st.integers(1, 12), st.just(8)))
    span = block * window
    n = draw(st.one_of(st.integers(1, min(40 * span, 5000)), sizes()))
    run = min(n, 40 * span, 5000)
    start = draw(st.integers(0, n - run))
    probes = draw(st.lists(st.integers(0, n - 1), max_size=20))
    return n, block, window, np.array([*range(start, start + run), *probes], dtype=np.int64)


@settings(max_examples=150, deadline=None)
@given(case=block_cases(), seed=st.integers(0, 2**64 - 1), epoch=st.integers(0, 2**32 - 1))
def test_the_block_order_equals_the_reference(case, seed, epoch) -> None:
    """order="block" runs the same Feistel code for its block order and for every window."""
    n, block, window, positions = case
    options = {"seed": seed, "epoch": epoch, "block_samples": block, "window_blocks": window}
    new = BlockOrder(n, **options)(positions)
    with mock.patch.object(_block, "FeistelPermutation", ReferencePermutation):
        old = BlockOrder(n, **options)(positions)  # the windows' permutations are built during the call
    _same(new, old)


def test_the_sampler_per_sample_path_and_block_order_equal_the_reference() -> None:
    n, world, rank = 10**10, 8, 3
    sampler = ResumableDistributedSampler(n, world, rank, seed=1, start_iter=12345)
    got = [index for index, _ in zip(sampler, range(20000), strict=False)]
    plan = plan_rank(n, 12345 * world, world, rank, Tail.PAD)
    expected = ReferencePermutation(n, round_keys(1, 0))(_reference_positions(plan, 0, 20000))
    assert got == expected.tolist()
    block = ResumableDistributedSampler(n, world, rank, seed=1, order="block")
    got_block = np.concatenate([c for c, _ in zip(block.iter_chunks(40000), range(3), strict=False)])
    with mock.patch.object(_block, "FeistelPermutation", ReferencePermutation):
        order = BlockOrder(n, seed=1, epoch=0, block_samples=16384, window_blocks=8)
        _same(got_block, order(_reference_positions(plan_rank(n, 0, world, rank, Tail.PAD), 0, 120000)))


@pytest.mark.parametrize("shape", [(), (3, 5), (2, 0)])
def test_any_shape_maps_elementwise(shape) -> None:
    n = 10**10
    positions = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape) * 7919 + 10**9
    got = FeistelPermutation(n, round_keys(4, 2))(positions)
    assert got.shape == shape
    _same(got.reshape(-1), ReferencePermutation(n, round_keys(4, 2))(positions.reshape(-1)))


@pytest.mark.parametrize("bad", [1000, 1023, 1024, 5000, -1, 2**40])
def test_positions_outside_the_domain_are_refused(bad) -> None:
    permutation = FeistelPermutation(1000, round_keys(0, 0))
    with pytest.raises(IndexError, match=r"\[0, 1000\)"):
        permutation(np.array([3, bad], dtype=np.int64))


def test_threads_sharing_one_permutation_get_the_reference_indices() -> None:
    """The work arrays are per thread: numpy releases the GIL inside each pass of the network."""
    from concurrent.futures import ThreadPoolExecutor

    n = 10**10
    permutation, reference = FeistelPermutation(n, round_keys(9, 1)), ReferencePermutation(n, round_keys(9, 1))
    chunks = [np.arange(k * 50_000, (k + 1) * 50_000, dtype=np.int64) * 1_000 for k in range(8)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(permutation, chunks))
    for got, positions in zip(results, chunks, strict=True):
        _same(got, reference(positions))
