import math

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler, TensorDataset

from tokenloom.formats.errors import ConfigError
from tokenloom.sampler import ResumableDistributedSampler


def ranks(n: int, world: int, **kwargs) -> list[list[int]]:
    return [list(ResumableDistributedSampler(n, world, r, **kwargs)) for r in range(world)]


@pytest.mark.parametrize("n", [0, 1, 5, 37, 100])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_ranks_partition_the_epoch(n: int, world: int) -> None:
    exact = ranks(n, world, seed=1, pad=False)
    assert sorted(i for part in exact for i in part) == list(range(n))
    assert max(map(len, exact)) - min(map(len, exact)) <= (1 if n else 0)

    padded = ranks(n, world, seed=1)
    assert {len(part) for part in padded} == {math.ceil(n / world)}
    flat = [i for part in padded for i in part]
    assert set(flat) == set(range(n))
    assert len(flat) - n == ResumableDistributedSampler(n, world, 0, seed=1).num_padded

    dropped = ranks(n, world, seed=1, drop_last=True)
    flat = [i for part in dropped for i in part]
    assert len(flat) == len(set(flat)) == n - n % world
    assert ResumableDistributedSampler(n, world, 0, seed=1, drop_last=True).num_dropped == n % world


def test_rank_r_takes_global_positions_r_plus_multiples_of_world() -> None:
    single = list(ResumableDistributedSampler(30, 1, 0, seed=9))
    assert ranks(30, 3, seed=9) == [single[r::3] for r in range(3)]


def test_same_arguments_give_the_same_indices() -> None:
    assert ranks(500, 4, seed=3) == ranks(500, 4, seed=3)
    assert ranks(500, 4, seed=3) != ranks(500, 4, seed=4)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(("n", "world", "seed", "epoch"), [(101, 4, 0, 0), (64, 3, 17, 5), (7, 10, 2, 1)])
def test_torch_order_reproduces_torch_distributed_sampler(n, world, seed, epoch, drop_last) -> None:
    dataset = TensorDataset(torch.arange(n))
    for rank in range(world):
        reference = DistributedSampler(dataset, world, rank, shuffle=True, seed=seed, drop_last=drop_last)
        reference.set_epoch(epoch)
        ours = ResumableDistributedSampler(
            n, world, rank, seed=seed, drop_last=drop_last, order="torch", start_epoch=epoch
        )
        assert list(ours) == list(reference)


def test_torch_order_is_randperm_seeded_with_seed_plus_epoch() -> None:
    expected = torch.randperm(50, generator=torch.Generator().manual_seed(7 + 3)).tolist()
    assert list(ResumableDistributedSampler(50, 1, 0, seed=7, order="torch", start_epoch=3)) == expected


def test_no_shuffle_keeps_dataset_order() -> None:
    assert ranks(10, 3, shuffle=False) == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]


def test_start_iter_skips_what_each_rank_already_yielded_as_the_seed_does() -> None:
    for rank in range(3):
        full = list(ResumableDistributedSampler(40, 3, rank, seed=2, start_epoch=4))
        resumed = ResumableDistributedSampler(40, 3, rank, seed=2, start_epoch=4, start_iter=5)
        assert len(resumed) == len(full) - 5
        assert list(resumed) == full[5:]


@pytest.mark.parametrize("n", [2**54 - 1, 2**62])
@pytest.mark.parametrize(("world", "options"), [(1, {}), (3, {}), (3, {"drop_last": True}), (3, {"pad": False})])
def test_resuming_at_the_end_of_the_largest_dataset_yields_nothing(n, world, options) -> None:
    """start_iter == the rank's count is "this epoch is exhausted": allowed, empty, and its state round-trips."""
    count = len(ResumableDistributedSampler(n, world, 0, **options))
    for rank in range(world):
        done = ResumableDistributedSampler(n, world, rank, start_iter=count, **options)
        state = done.state_dict()
        assert len(done) == 0 and next(done.iter_chunks(8), None) is None
        again = ResumableDistributedSampler(n, world, rank, **options)
        again.load_state_dict(state)
        assert len(again) == 0 and again.state_dict() == state and next(iter(again), None) is None
    with pytest.raises(ConfigError, match=f"start_iter is {count + 1}"):
        ResumableDistributedSampler(n, world, 0, start_iter=count + 1, **options)


def test_a_finished_epoch_moves_on_and_set_epoch_keeps_the_current_position() -> None:
    sampler = ResumableDistributedSampler(12, 2, 1, seed=0)
    first = list(sampler)
    assert sampler.epoch == 1
    sampler.set_epoch(1)  # the usual loop calls set_epoch(epoch) each epoch: no reset needed
    second = list(sampler)
    assert second == list(ResumableDistributedSampler(12, 2, 1, seed=0, start_epoch=1))
    assert first != second

    it = iter(sampler)
    consumed = [next(it) for _ in range(2)]
    sampler.set_epoch(2)  # same epoch: the position survives (resume-safe)
    assert consumed + list(sampler) == list(ResumableDistributedSampler(12, 2, 1, seed=0, start_epoch=2))
    sampler.set_epoch(0)
    assert list(sampler) == first


def test_iter_chunks_yields_the_same_indices_and_tracks_the_position() -> None:
    per_sample = list(ResumableDistributedSampler(1003, 3, 2, seed=8))
    sampler = ResumableDistributedSampler(1003, 3, 2, seed=8)
    chunks = sampler.iter_chunks(100)
    head = next(chunks)
    assert head.dtype == np.int64
    assert sampler.consumed == 300
    rest = np.concatenate(list(chunks))
    assert np.concatenate([head, rest]).tolist() == per_sample


def test_a_superseded_iterator_refuses_to_continue() -> None:
    sampler = ResumableDistributedSampler(20, 1, 0)
    old = iter(sampler)
    next(old)
    newer = iter(sampler)
    next(newer)
    with pytest.raises(RuntimeError, match="superseded"):
        next(old)


def test_len_is_what_this_rank_still_yields() -> None:
    sampler = ResumableDistributedSampler(10, 4, 3, pad=False)
    assert len(sampler) == 2
    it = iter(sampler)
    next(it)
    assert len(sampler) == 1
