"""A sampler state is refused by another dataset of the same length; absurd epochs are refused (issue #11)."""

from __future__ import annotations

import pytest

from tokenloom.formats import ConfigError, ResumeMismatchError
from tokenloom.sampler import ResumableDistributedSampler


class Data:
    def __init__(self, n: int, fingerprint: str) -> None:
        self.n, self._fingerprint = n, fingerprint

    def __len__(self) -> int:
        return self.n

    def fingerprint(self) -> str:
        return self._fingerprint


class Attr:
    def __init__(self, n: int, fingerprint: str | None) -> None:
        self.n, self.fingerprint = n, fingerprint

    def __len__(self) -> int:
        return self.n


def _consume(sampler: ResumableDistributedSampler, k: int) -> None:
    iterator = iter(sampler)
    for _ in range(k):
        next(iterator)


@pytest.mark.parametrize("kind", [Data, Attr])
def test_state_of_another_dataset_of_the_same_length_is_refused(kind) -> None:
    first = ResumableDistributedSampler(kind(100, "aaaa"), 1, 0, seed=3)
    _consume(first, 7)
    state = first.state_dict()
    assert state["data_fingerprint"] == "aaaa"
    with pytest.raises(ResumeMismatchError, match=r"another dataset.*'aaaa'.*'bbbb'"):
        ResumableDistributedSampler(kind(100, "bbbb"), 1, 0, seed=3).load_state_dict(state)
    same = ResumableDistributedSampler(kind(100, "aaaa"), 1, 0, seed=3)
    same.load_state_dict(state)
    assert same.consumed == 7


def test_state_without_a_dataset_fingerprint_still_loads() -> None:
    plain = ResumableDistributedSampler(100, 1, 0, seed=3)
    _consume(plain, 5)
    state = plain.state_dict()
    assert "data_fingerprint" not in state
    other = ResumableDistributedSampler(Data(100, "x"), 1, 0, seed=3)
    other.load_state_dict(state)
    assert other.consumed == 5


@pytest.mark.parametrize("epoch", [10**30, 2**32, -1])
def test_absurd_epochs_are_refused(epoch: int) -> None:
    sampler = ResumableDistributedSampler(10, 1, 0)
    with pytest.raises(ConfigError, match="epoch"):
        sampler.set_epoch(epoch)
    with pytest.raises(ConfigError, match="epoch"):
        ResumableDistributedSampler(10, 1, 0, start_epoch=epoch)
    state = sampler.state_dict()
    state["epoch"] = epoch
    with pytest.raises((ConfigError, ResumeMismatchError), match="epoch"):
        ResumableDistributedSampler(10, 1, 0).load_state_dict(state)
    sampler.set_epoch(2**32 - 1)  # the largest accepted
    assert len(list(sampler)) == 10
