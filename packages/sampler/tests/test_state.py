import json

import pytest

from tokenloom.formats.errors import ResumeMismatchError
from tokenloom.sampler import ResumableDistributedSampler


def test_state_is_plain_json_and_round_trips() -> None:
    sampler = ResumableDistributedSampler(100, 4, 1, seed=3, start_epoch=2)
    it = iter(sampler)
    for _ in range(5):
        next(it)
    state = sampler.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert (state["epoch"], state["consumed"], state["n"], state["seed"]) == (2, 20, 100, 3)
    assert (state["order"], state["pad"], state["drop_last"]) == ("feistel", True, False)
    assert isinstance(state["fingerprint"], str)

    resumed = ResumableDistributedSampler(100, 4, 1, seed=3)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert list(resumed) == list(it)


def test_a_state_from_another_sampler_lists_every_differing_field() -> None:
    state = ResumableDistributedSampler(100, seed=1).state_dict()
    other = ResumableDistributedSampler(120, seed=2, order="torch", drop_last=True)
    with pytest.raises(ResumeMismatchError) as raised:
        other.load_state_dict(state)
    message = str(raised.value)
    assert "n: saved 100, this sampler 120" in message
    assert "seed: saved 1, this sampler 2" in message
    assert "order: saved 'feistel', this sampler 'torch'" in message
    assert "drop_last: saved False, this sampler True" in message
    assert "shuffle:" not in message


def test_an_edited_state_is_caught_by_its_fingerprint() -> None:
    sampler = ResumableDistributedSampler(100, seed=1)
    state = sampler.state_dict()
    state["fingerprint"] = "0" * 16
    with pytest.raises(ResumeMismatchError, match="fingerprint"):
        sampler.load_state_dict(state)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"consumed": 101}, "consumed in \\[0, 100\\]"),
        ({"epoch": -1}, "epoch >= 0"),
        ({"consumed": "3"}, "wrong type"),
        ({"format": "other/9"}, "format"),
    ],
)
def test_malformed_states_are_refused(change: dict, match: str) -> None:
    sampler = ResumableDistributedSampler(100)
    state = {**sampler.state_dict(), **change}
    with pytest.raises(ResumeMismatchError, match=match):
        sampler.load_state_dict(state)


def test_missing_keys_and_non_dicts_are_refused() -> None:
    sampler = ResumableDistributedSampler(100)
    state = sampler.state_dict()
    del state["seed"]
    with pytest.raises(ResumeMismatchError, match="lacks seed"):
        sampler.load_state_dict(state)
    with pytest.raises(ResumeMismatchError, match="must be a dict"):
        sampler.load_state_dict([1, 2])  # pyright: ignore[reportArgumentType]


def test_every_rank_reports_the_same_state_in_lock_step() -> None:
    samplers = [ResumableDistributedSampler(50, 3, r, seed=4) for r in range(3)]
    iterators = [iter(s) for s in samplers]
    for _ in range(7):
        for it in iterators:
            next(it)
    states = [s.state_dict() for s in samplers]
    assert states[0] == states[1] == states[2]
    assert states[0]["consumed"] == 21


def test_a_finished_epoch_reports_everything_consumed_with_drop_last() -> None:
    sampler = ResumableDistributedSampler(10, 4, 0, drop_last=True)
    it = iter(sampler)
    next(it)
    next(it)
    assert sampler.state_dict()["consumed"] == 10  # the dropped tail is not left for a resume
