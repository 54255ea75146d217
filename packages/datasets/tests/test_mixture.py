"""MixtureDataset: weights, proportions at every prefix, determinism, epochs, resume."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from tokenloom.datasets import MixtureDataset, collate, interleave
from tokenloom.formats import ConfigError, ResumeMismatchError
from tokenloom.sampler import MixSchedule


class Constant(Dataset):
    def __init__(self, source, n):
        self.source, self.n = source, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"input_ids": torch.tensor([self.source, i]), "labels": torch.tensor([self.source, i])}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=1, max_size=6).filter(lambda raw: sum(raw) > 0))
def test_realised_counts_within_one_sample_of_target_at_every_prefix(raw):
    # the O(1) schedule's bound is reported per source (about one sample; wave 1's O(N) loop held < 1)
    weights = np.array(raw, dtype=np.float64) / sum(raw)
    sources = interleave(weights, 600)
    counts = np.cumsum(np.eye(len(weights))[sources], axis=0)
    schedule = MixSchedule(weights)
    for s in range(len(weights)):
        targets = np.arange(1, 601) * schedule.effective_rate(s)
        assert np.abs(counts[:, s] - targets).max() <= schedule.discrepancy(s) + 1e-9
        assert schedule.discrepancy(s) < 1.5
    assert np.abs(counts - np.arange(1, 601)[:, None] * weights).max() < 1.5
    assert (counts[:, weights == 0] == 0).all()


def test_mixture_reports_counts_and_reads_every_source():
    mix = MixtureDataset([Constant(0, 10), Constant(1, 5)], [0.75, 0.25], seed=1, num_samples=8)
    assert mix.source_counts.tolist() == [6, 2]
    got = [mix[i]["input_ids"][0].item() for i in range(len(mix))]
    assert got.count(0) == 6 and got.count(1) == 2
    again = MixtureDataset([Constant(0, 10), Constant(1, 5)], [0.75, 0.25], seed=1, num_samples=8)
    assert [again[i]["input_ids"].tolist() for i in range(8)] == [mix[i]["input_ids"].tolist() for i in range(8)]


def test_epochs_continue_through_a_source():
    mix = MixtureDataset([Constant(0, 10)], [1.0], seed=0, num_samples=4)
    first = [mix[i]["input_ids"][1].item() for i in range(4)]
    mix.set_epoch(1)
    second = [mix[i]["input_ids"][1].item() for i in range(4)]
    assert second == [(x + 4) % 10 for x in first]


@pytest.mark.parametrize("weights", [[0.5, 0.6], [1.2, -0.2], [float("nan"), 1.0], [1.0], [0.5, 0.4999]], ids=str)
def test_bad_weights(weights):
    with pytest.raises(ConfigError, match="weights"):
        MixtureDataset([Constant(0, 3), Constant(1, 3)], weights, seed=0)


def test_state_dict_round_trip_and_mismatch():
    mix = MixtureDataset([Constant(0, 10), Constant(1, 5)], [0.5, 0.5], seed=3)
    mix.set_epoch(2)
    other = MixtureDataset([Constant(0, 10), Constant(1, 5)], [0.5, 0.5], seed=3)
    other.load_state_dict(mix.state_dict())
    assert other.epoch == 2
    with pytest.raises(ResumeMismatchError):
        MixtureDataset([Constant(0, 10), Constant(1, 5)], [0.5, 0.5], seed=4).load_state_dict(mix.state_dict())


def test_stateful_dataloader_resumes_with_two_workers():
    def make():
        mix = MixtureDataset([Constant(0, 40), Constant(1, 40)], [0.3, 0.7], seed=5, num_samples=64)
        return StatefulDataLoader(mix, batch_size=4, num_workers=2, collate_fn=collate)

    full = [batch["input_ids"] for batch in make()]
    loader = make()
    iterator = iter(loader)
    head = [next(iterator)["input_ids"] for _ in range(5)]
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    tail = [batch["input_ids"] for batch in resumed]
    assert len(head) + len(tail) == len(full)
    for got, want in zip(head + tail, full, strict=True):
        assert torch.equal(got, want)


def test_weights_within_the_tolerance_are_accepted():
    mix = MixtureDataset([Constant(0, 3), Constant(1, 3)], [0.5, 0.5 - 5e-7], seed=0)
    assert mix.source_counts.sum() == len(mix) == 6
    with pytest.raises(ConfigError, match="sum to"):
        MixtureDataset([Constant(0, 3), Constant(1, 3)], [0.5, 0.5 - 2e-6], seed=0)


def test_a_billion_sample_mixture_stores_nothing_of_its_length():
    mix = MixtureDataset([Constant(0, 10**9), Constant(1, 10**9)], [0.3, 0.7], seed=2, num_samples=10**9)
    # rates are realised in 22-bit fixed point: within 2^-22 of the weights, counts exact for those rates
    assert np.abs(mix.source_counts - np.array([3e8, 7e8])).max() <= 10**9 * 2**-22
    assert mix.source_counts.sum() == 10**9
    assert not any(isinstance(v, np.ndarray) and v.size > 16 for v in vars(mix).values())
    source, inner = mix.locate(10**9 - 1)
    assert source in (0, 1) and 0 <= inner < 10**9
