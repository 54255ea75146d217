"""Mixing schedules: exact counts, low discrepancy, drains, determinism, O(1) memory."""

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenloom.formats.errors import ConfigError
from tokenloom.sampler import CurriculumSchedule, MixSchedule


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=10).filter(lambda raw: sum(raw) > 0), st.integers(0, 99))
def test_mix_counts_match_the_walk_and_stay_within_the_reported_bound(raw, key):
    mix = MixSchedule(raw, key=key)
    n = 3000
    source, rank = mix.locate(np.arange(n))
    onehot = np.eye(len(raw), dtype=np.int64)[source]
    counts = np.cumsum(onehot, axis=0)
    # the rank of every position inside its source is the number of earlier positions of that source
    assert (rank == counts[np.arange(n), source] - 1).all()
    for s in range(len(raw)):
        for x in (0, 1, 17, 999, n):
            assert mix.count(s, x) == (counts[x - 1, s] if x else 0)
        deviation = np.abs(counts[:, s] - np.arange(1, n + 1) * mix.effective_rate(s)).max()
        assert deviation <= mix.discrepancy(s) + 1e-9
        assert mix.discrepancy(s) < 1.5
    assert (counts[:, np.asarray(raw) == 0] == 0).all()


def test_first_position_with_inverts_count():
    mix = MixSchedule([0.6, 0.3, 0.1], key=4)
    for source in range(3):
        for draws in (1, 2, 50, 1234):
            x = mix.first_position_with(source, draws)
            assert mix.count(source, x) >= draws > mix.count(source, x - 1)


def _schedule(**overrides):
    args: dict[str, Any] = dict(
        bucket_samples=[400, 300, 900],
        bucket_tokens=[400 * 128, 300 * 128, 900 * 128],
        durations=[30_000, 60_000, 50_000],
        weights=[[1, 1, 0], [0.2, 0.5, 0.3], [0.1, 0.0, 0.9]],
        seed=11,
    )
    args.update(overrides)
    return CurriculumSchedule(**args)


def test_every_sample_of_a_bucket_is_drawn_at_most_once_and_drains_are_where_counts_run_out():
    schedule = _schedule()
    phase, bucket, index = schedule.locate(np.arange(schedule.num_samples))
    pairs = bucket * 10**6 + index
    assert len(np.unique(pairs)) == schedule.num_samples
    assert schedule.drains, "bucket 1 (300 samples) must run dry in phase 1"
    drain = schedule.drains[0]
    assert drain.bucket == 1
    # right before the drain the bucket's samples are all used; from it on it is never drawn
    assert (bucket[: drain.position] == 1).sum() == 300
    assert not (bucket[drain.position :] == 1).any()
    assert schedule.counts_before(drain.position)[1] == 300
    # phases are contiguous, in order, and their tokens add up to at least their budgets (carry-over)
    bounds = schedule.phase_bounds
    assert bounds[0][0] == 0 and bounds[-1][1] == schedule.num_samples
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    assert (phase[:-1] <= phase[1:]).all()
    cumulative = np.cumsum(schedule.phase_tokens)
    assert (cumulative >= np.cumsum(schedule.durations)).all()
    assert (cumulative - np.cumsum(schedule.durations) < 128).all()


def test_same_inputs_same_schedule_another_seed_another_order():
    a, b, c = _schedule(), _schedule(), _schedule(seed=12)
    positions = np.arange(a.num_samples)
    assert all(np.array_equal(x, y) for x, y in zip(a.locate(positions), b.locate(positions), strict=True))
    assert not np.array_equal(a.locate(positions)[2], c.locate(positions)[2])


def test_token_shares_stay_within_a_tenth_of_a_point_at_every_prefix_of_a_million_tokens():
    seq_len = 512
    weights = np.array([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4]])
    schedule = CurriculumSchedule([10**6] * 4, [10**6 * seq_len] * 4, [2 * 10**8, 2 * 10**8], weights, seed=3)
    for phase, (start, end) in enumerate(schedule.phase_bounds):
        _, bucket, _ = schedule.draws(np.arange(start, end))
        tokens = np.cumsum(np.eye(4, dtype=np.int64)[bucket] * seq_len, axis=0)
        total = np.arange(1, end - start + 1) * seq_len
        from_million = total >= 10**6
        shares = tokens[from_million] / total[from_million, None]
        assert np.abs(shares - weights[phase]).max() < 0.001


def test_repeat_reads_new_permutations_and_halts_later():
    once = _schedule()
    twice = _schedule(max_epochs=2)
    assert twice.drains == [] or twice.drains[0].position > once.drains[0].position
    _, bucket, index = twice.locate(np.arange(twice.num_samples))
    for b, size in enumerate(twice.bucket_samples):
        picked = index[bucket == b]
        assert np.bincount(picked, minlength=size).max() <= 2
    # up to the first drain of the one-epoch schedule both are the same
    head = np.arange(once.drains[0].position)
    assert all(np.array_equal(x, y) for x, y in zip(once.locate(head), twice.locate(head), strict=True))


def test_a_curriculum_of_a_trillion_tokens_builds_fast_in_constant_memory():
    tokens, seq_len = 10**12, 2048
    schedule = CurriculumSchedule(
        [tokens // seq_len // 10] * 10,
        [tokens // 10] * 10,
        [tokens // 100] * 100,
        np.random.default_rng(0).random((100, 10)),
        seed=5,
    )
    assert len(schedule.segments) <= 100 + 10
    assert schedule.total_tokens >= tokens - 10 * seq_len or schedule.ended_early
    positions = np.arange(schedule.num_samples - 1000, schedule.num_samples)
    _, _, index = schedule.locate(positions)
    assert (index < tokens // seq_len // 10).all()


def test_a_phase_without_buckets_left_ends_the_curriculum_early():
    schedule = _schedule(durations=[10_000, 10**7], weights=[[1, 1, 1], [1, 1, 0]])
    assert schedule.ended_early and "phase 1" in schedule.ended_early
    assert schedule.num_samples == 700 + schedule.counts_before(schedule.num_samples)[2]


def test_bad_inputs_name_the_field():
    with pytest.raises(ConfigError, match="weights"):
        MixSchedule([0, 0])
    with pytest.raises(ConfigError, match="weights"):
        MixSchedule([1.0, float("nan")])
    with pytest.raises(ConfigError, match="too uneven"):
        MixSchedule([1.0, 1e-9])
    with pytest.raises(ConfigError, match="max_repetition"):
        _schedule(max_epochs=0)
    with pytest.raises(ConfigError, match="shape"):
        _schedule(weights=[[1, 1, 1]])
    with pytest.raises(ConfigError, match="duration_tokens"):
        _schedule(durations=[0, 1, 1])


def test_the_few_positions_path_equals_the_vectorised_one():
    schedule = _schedule(max_epochs=2)
    rng = np.random.default_rng(0)
    for _ in range(20):
        positions = rng.integers(0, schedule.num_samples, size=int(rng.integers(1, 40)))
        few = schedule.locate(positions)
        many = schedule.locate(np.concatenate([positions, np.arange(100)]))
        assert all(np.array_equal(a, b[: len(positions)]) for a, b in zip(few, many, strict=True))


def test_a_block_order_per_bucket_keeps_the_mix_and_reads_each_epoch_once_in_windows():
    blocks = [(16, 2), None, (50, 1)]
    feistel = _schedule(max_epochs=2)
    block = _schedule(max_epochs=2, orders=blocks)
    positions = np.arange(block.num_samples)
    phase_f, bucket_f, index_f = feistel.locate(positions)
    phase_b, bucket_b, index_b = block.locate(positions)
    assert block.num_samples == feistel.num_samples and block.drains == feistel.drains
    assert np.array_equal(phase_f, phase_b) and np.array_equal(bucket_f, bucket_b)  # the mix is the order's
    assert np.array_equal(index_f[bucket_b == 1], index_b[bucket_b == 1])  # a feistel bucket is unchanged
    _, _, draw = block.draws(positions)
    for b, shape in enumerate(blocks):
        if shape is None:
            continue
        size, window = block.bucket_samples[b], shape[0] * shape[1]
        rows = np.flatnonzero(bucket_b == b)
        for epoch in np.unique(draw[rows] // size).tolist():
            picked = index_b[rows[draw[rows] // size == epoch]]
            assert len(np.unique(picked)) == len(picked)  # each epoch: every sample at most once
            for first in range(0, len(picked) - window + 1, window):
                assert len(np.unique(picked[first : first + window] // shape[0])) <= shape[1]
    few = block.locate(positions[::37][:40])  # the DataLoader-batch path agrees
    assert all(np.array_equal(a, b[::37][:40]) for a, b in zip(few, (phase_b, bucket_b, index_b), strict=True))


@pytest.mark.parametrize("orders", [[(16, 2)], [(0, 2), None, None], [(16, True), None, None], ["block", None, None]])
def test_bad_block_orders_are_named(orders):
    with pytest.raises(ConfigError, match="orders"):
        _schedule(orders=orders)


def test_a_block_ordered_bucket_too_big_for_a_table_agrees_on_both_paths():
    big = 3 << 20  # above the 2^20-sample table limit: the batch path evaluates the block order per index
    schedule = _schedule(
        bucket_samples=[big, 300, 900], bucket_tokens=[big * 128, 300 * 128, 900 * 128], orders=[(4096, 4), None, None]
    )
    positions = np.arange(0, schedule.num_samples, 7)[:40]
    few = schedule.locate(positions)
    many = schedule.locate(np.concatenate([positions, np.arange(100)]))
    assert all(np.array_equal(a, b[: len(positions)]) for a, b in zip(few, many, strict=True))
