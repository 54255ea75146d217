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


@pytest.mark.parametrize("how", ["removed", "null", "plain-length"])
def test_state_without_a_dataset_fingerprint_is_refused_unless_allowed(how: str) -> None:
    """#21: a state whose data_fingerprint was removed resumed on another dataset of the same length."""
    if how == "plain-length":  # saved from a plain length (as every state before #11 was saved)
        saver = ResumableDistributedSampler(100, 1, 0, seed=3)
    else:
        saver = ResumableDistributedSampler(Data(100, "aaaa"), 1, 0, seed=3)
    _consume(saver, 5)
    state = saver.state_dict()
    if how == "removed":
        del state["data_fingerprint"]
    elif how == "null":
        state["data_fingerprint"] = None
    assert state.get("data_fingerprint") is None
    with pytest.raises(ResumeMismatchError, match="allow_missing_data_fingerprint=True") as caught:
        ResumableDistributedSampler(Data(100, "bbbb"), 1, 0, seed=3).load_state_dict(state)
    assert caught.value.field == "data_fingerprint" and "'bbbb'" in str(caught.value)
    allowed = ResumableDistributedSampler(Data(100, "bbbb"), 1, 0, seed=3, allow_missing_data_fingerprint=True)
    allowed.load_state_dict(state)
    assert allowed.consumed == 5
    plain = ResumableDistributedSampler(100, 1, 0, seed=3)  # nothing of its own to compare: accepted
    plain.load_state_dict(state)
    assert plain.consumed == 5


def test_a_data_fingerprint_of_the_wrong_type_is_refused() -> None:
    state = ResumableDistributedSampler(Data(100, "aaaa"), 1, 0).state_dict()
    state["data_fingerprint"] = 12
    with pytest.raises(ResumeMismatchError, match="data_fingerprint is int 12, expected a string"):
        ResumableDistributedSampler(Data(100, "aaaa"), 1, 0).load_state_dict(state)


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
