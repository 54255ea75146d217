"""Attack on block orders in CurriculumSchedule: random sizes, blocks, windows and epochs; cost; bounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenloom.formats.errors import ConfigError
from tokenloom.sampler import BlockOrder, CurriculumSchedule
from tokenloom.sampler._block import MAX_BLOCK_SAMPLES, MAX_WINDOW_BLOCKS

_order = st.one_of(st.none(), st.tuples(st.integers(1, 20), st.integers(1, 5)))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 70), min_size=2, max_size=3),
    st.lists(_order, min_size=3, max_size=3),
    st.integers(1, 3),
    st.integers(0, 2**32),
)
def test_each_bucket_epoch_is_a_permutation_read_a_window_at_a_time(sizes, orders, epochs, seed):
    orders = orders[: len(sizes)]
    schedule = CurriculumSchedule(
        bucket_samples=sizes, bucket_tokens=[n * 8 for n in sizes], durations=[sum(sizes) * 8 * epochs],
        weights=[[1.0] * len(sizes)], seed=seed, max_epochs=epochs, orders=orders,
    )  # fmt: skip
    positions = np.arange(schedule.num_samples)
    _, bucket, index = schedule.locate(positions)
    feistel = CurriculumSchedule(
        bucket_samples=sizes, bucket_tokens=[n * 8 for n in sizes], durations=[sum(sizes) * 8 * epochs],
        weights=[[1.0] * len(sizes)], seed=seed, max_epochs=epochs,
    )  # fmt: skip
    assert np.array_equal(feistel.locate(positions)[1], bucket)  # which bucket serves each position: unchanged
    _, _, draw = schedule.draws(positions)
    few = schedule.locate_list(positions.tolist())  # the DataLoader path (per-process tables) agrees
    assert few[1] == bucket.tolist() and few[2] == index.tolist()
    for b, n in enumerate(sizes):
        rows = np.flatnonzero(bucket == b)
        assert np.array_equal(draw[rows], np.arange(len(rows)))
        for epoch in range(-(-len(rows) // n)):
            picked = index[rows[epoch * n : (epoch + 1) * n]]
            assert len(set(picked.tolist())) == len(picked) and ((picked >= 0) & (picked < n)).all()
            if len(picked) == n:
                assert sorted(picked.tolist()) == list(range(n))
            if orders[b] is not None:
                block_samples, window_blocks = orders[b]
                window = block_samples * window_blocks
                for first in range(0, len(picked), window):
                    assert len(np.unique(picked[first : first + window] // block_samples)) <= window_blocks


def test_a_bucket_table_over_many_windows_is_the_order_of_each_position():
    """A curriculum builds a bucket epoch's whole table at its first batch: 1,024 windows of 1,024 samples here.
    The table is grouped by window in one pass (a mask per window made it O(samples * windows): about 7 s at the
    first batch of a 2^20-sample bucket in blocks of 128, 2 a window); its cost is not timed here (noisy machines),
    only that the grouped table is a permutation and equals the order position by position."""
    n = 1 << 20
    positions = np.arange(n)
    many = BlockOrder(n, seed=5, epoch=1, block_samples=16, window_blocks=64)
    table = many(positions)
    assert np.array_equal(np.sort(table), positions)
    shuffled = np.random.default_rng(0).permutation(n)[:5000]  # unsorted positions over many windows
    assert np.array_equal(many(shuffled), table[shuffled])


@pytest.mark.parametrize("block", [(MAX_BLOCK_SAMPLES + 1, 1), (16, MAX_WINDOW_BLOCKS + 1), (2**70, 2)])
def test_block_sizes_past_the_int64_arithmetic_are_refused(block):
    with pytest.raises(ConfigError, match=r"orders\[0\]"):
        CurriculumSchedule(
            bucket_samples=[10], bucket_tokens=[80], durations=[80], weights=[[1.0]], seed=1, orders=[block]
        )
