import numpy as np
import pytest

from tokenloom.sampler import ResumableDistributedSampler

SIZES = [0, 1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 100, 255, 256, 257, 1000, 4097, 65536, 65537]


@pytest.mark.parametrize("n", SIZES)
def test_the_epoch_order_is_a_permutation_of_range_n(n: int) -> None:
    for seed, epoch in [(0, 0), (1, 0), (0, 1), (2**63 + 5, 9)]:
        order = ResumableDistributedSampler(n, 1, 0, seed=seed).indices_at(np.arange(n), epoch)
        assert np.array_equal(np.sort(order), np.arange(n))


def test_seed_and_epoch_change_the_order_and_nothing_else_does() -> None:
    sampler = ResumableDistributedSampler(1000, 1, 0, seed=5)
    base = sampler.indices_at(np.arange(1000), 0)
    assert not np.array_equal(base, np.arange(1000))
    assert not np.array_equal(base, sampler.indices_at(np.arange(1000), 1))
    other_seed = ResumableDistributedSampler(1000, 1, 0, seed=6).indices_at(np.arange(1000), 0)
    assert not np.array_equal(base, other_seed)
    again = ResumableDistributedSampler(1000, 4, 3, seed=5, drop_last=True).indices_at(np.arange(1000), 0)
    assert np.array_equal(base, again)


def test_positions_look_up_the_same_index_alone_or_in_any_chunk() -> None:
    sampler = ResumableDistributedSampler(10**10, 1, 0, seed=3)
    positions = np.array([0, 1, 12345, 10**10 - 1, 7 * 10**9], dtype=np.int64)
    together = sampler.indices_at(positions)
    alone = np.concatenate([sampler.indices_at(positions[i : i + 1]) for i in range(len(positions))])
    assert np.array_equal(together, alone)
    assert ((together >= 0) & (together < 10**10)).all()
    assert len(set(together.tolist())) == len(positions)


def test_golden_values_pin_the_order_on_every_machine() -> None:
    # The order is part of the resume contract: a change here breaks saved states.
    sampler = ResumableDistributedSampler(1000, 1, 0, seed=0)
    assert sampler.indices_at(np.arange(8), 0).tolist() == GOLDEN_1000_SEED0_EPOCH0
    big = ResumableDistributedSampler(10**10, 1, 0, seed=42)
    assert big.indices_at(np.arange(4), 7).tolist() == GOLDEN_1E10_SEED42_EPOCH7


def test_the_order_looks_shuffled() -> None:
    n = 100_000
    order = ResumableDistributedSampler(n, 1, 0, seed=11).indices_at(np.arange(n)).astype(np.float64)
    # no trace of the position in the index: correlation near 0, few fixed points
    assert abs(np.corrcoef(order, np.arange(n))[0, 1]) < 0.02
    assert (order == np.arange(n)).sum() < 20
    # first half of the epoch draws about half of each quarter of the dataset
    first_half = order[: n // 2]
    counts = np.histogram(first_half, bins=4, range=(0, n))[0]
    assert np.all(np.abs(counts - n / 8) < n / 100)


GOLDEN_1000_SEED0_EPOCH0 = [549, 43, 812, 645, 526, 818, 296, 77]
GOLDEN_1E10_SEED42_EPOCH7 = [4330208932, 3231662987, 3765875069, 5263146953]


def test_the_scalar_path_equals_the_vectorised_one():
    from tokenloom.sampler._feistel import FeistelPermutation, round_keys

    for n in (1, 2, 5, 1000, 12345):
        permutation = FeistelPermutation(n, round_keys(7, 3))
        positions = np.arange(n, dtype=np.int64)
        assert [permutation.one(p) for p in positions.tolist()] == permutation(positions).tolist()
