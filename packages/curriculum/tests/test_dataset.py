"""CurriculumDataset: schedule vs samples, token unit, drains and policies, state, packing."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from curriculum_helpers import SEQ_LEN, WINDOW

from tokenloom.curriculum import (
    BucketExhausted,
    CurriculumConfig,
    CurriculumDataset,
    ExhaustionPolicy,
    Phase,
)
from tokenloom.formats import ResumeMismatchError


def config(root, *, policy=None, **overrides):
    phases = (
        Phase(duration_tokens=3000, mix={"a": 1, "b": 1}),
        Phase(duration_tokens=4000, mix={"a": 0.2, "b": 0.3, "c": 0.5}),
        Phase(duration_tokens=4000, mix={"b": 0.6, "c": 0.4}),
    )
    values: dict[str, Any] = dict(path=root, seq_len=SEQ_LEN, packing=False, curriculum=phases)
    if policy is not None:
        values["bucket_exhaustion"] = policy
    values.update(overrides)
    return CurriculumConfig(**values)


def identities(batch):
    return list(zip(batch["bucket"].tolist(), (batch["input_ids"][:, 0] // WINDOW).tolist(), strict=True))


def test_samples_are_what_the_schedule_says(corpus):
    ds = CurriculumDataset(config(corpus, policy="renormalise"), seed=7)
    positions = np.arange(len(ds))
    phase, bucket, index = ds.locate(positions)
    batch = ds.__getitems__(positions.tolist()).batched
    assert identities(batch) == list(zip(bucket.tolist(), index.tolist(), strict=True))
    assert batch["input_ids"].shape == (len(ds), SEQ_LEN) and batch["labels"].dtype == torch.int64
    assert torch.equal(batch["labels"][:, :-1], batch["input_ids"][:, 1:])
    # every (bucket, index) at most once; phase runs in order
    assert len(set(identities(batch))) == len(ds)
    assert (np.diff(phase) >= 0).all()
    single = ds[5]
    assert single["bucket"].item() == bucket[5] and single["input_ids"][0].item() // WINDOW == index[5]


def test_one_token_unit_phase_tokens_carry_over_and_the_curriculum_ends_at_its_budget(corpus):
    ds = CurriculumDataset(config(corpus, policy="renormalise"), seed=7)
    schedule = ds.schedule
    assert int(ds.budget_tokens(np.arange(len(ds))).sum()) == schedule.total_tokens == len(ds) * SEQ_LEN
    assert schedule.total_tokens >= 11000 > schedule.total_tokens - SEQ_LEN  # last phase ends the curriculum
    for (start, end), tokens in zip(schedule.phase_bounds, schedule.phase_tokens, strict=True):
        assert int(ds.budget_tokens(np.arange(start, end)).sum()) == tokens


def test_halt_policy_raises_at_the_drain_and_names_it(corpus):
    ds = CurriculumDataset(config(corpus), seed=7)
    assert ds.policy is ExhaustionPolicy.HALT and ds.halt is not None
    assert ds.buckets[ds.halt.bucket] == "b"
    ds.__getitems__(list(range(ds.halt_position - 4, ds.halt_position)))  # fine right up to it
    with pytest.raises(BucketExhausted, match="bucket 'b' runs dry") as caught:
        ds.__getitems__([ds.halt_position - 1, ds.halt_position])
    assert ds.halt is not None
    assert caught.value.bucket == "b" and caught.value.position == ds.halt.position
    # the renormalising plan is the same up to the drain, and carries on past it
    other = CurriculumDataset(config(corpus, policy="renormalise"), seed=7)
    head = np.arange(ds.halt_position)
    assert all(np.array_equal(x, y) for x, y in zip(ds.locate(head), other.locate(head), strict=True))
    assert len(other) == len(ds)
    other.__getitems__([len(other) - 1])


def test_plan_is_plain_json_with_phases_demand_and_drains(corpus):
    import json

    ds = CurriculumDataset(config(corpus, policy="renormalise"), seed=7)
    plan = json.loads(json.dumps(ds.plan()))
    assert [[p["start_sample"], p["end_sample"]] for p in plan["phases"]] == [list(b) for b in ds.schedule.phase_bounds]
    assert plan["samples"] == len(ds) and plan["tokens"] == ds.schedule.total_tokens
    assert [d["bucket"] for d in plan["drains"]] == ["b"] and plan["drains"][0]["effect"] == "renormalise"
    demand = {b["name"]: b["demand_samples"] for b in plan["buckets"]}
    _, bucket, _ = ds.locate(np.arange(len(ds)))
    assert demand == dict(zip(ds.buckets, np.bincount(bucket, minlength=3).tolist(), strict=True))


def test_global_batch_size_rounds_the_halt_down_to_its_step(corpus):
    ds = CurriculumDataset(config(corpus), seed=7, global_batch_size=12)
    assert ds.halt is not None
    assert ds.halt_position % 12 == 0 and ds.halt.position - 12 < ds.halt_position <= ds.halt.position
    assert ds.halt_step() == ds.halt_position // 12


def test_repeat_policy_reads_second_epochs_with_a_new_permutation(corpus):
    ds = CurriculumDataset(config(corpus, policy="repeat", max_repetition=2), seed=7)
    assert ds.halt is None
    _, bucket, index = ds.locate(np.arange(len(ds)))
    b = ds.buckets.index("b")
    picked = index[bucket == b]
    assert len(picked) > 200 and np.bincount(picked).max() == 2
    first, second = picked[:200], picked[200:]
    assert sorted(first.tolist()) == list(range(200))
    assert second.tolist() != first[: len(second)].tolist()


def test_state_round_trip_and_every_differing_field_listed(corpus, tmp_path):
    ds = CurriculumDataset(config(corpus), seed=7)
    state = ds.state_dict(consumed=10)
    CurriculumDataset(config(corpus), seed=7).load_state_dict(state)
    with pytest.raises(ResumeMismatchError, match="seed") as caught:
        CurriculumDataset(config(corpus, seq_len=8), seed=8).load_state_dict(state)
    assert "max_length" in str(caught.value) and "config" in str(caught.value)


@pytest.mark.parametrize("consumed", ["12", -5, 3.7, True, 10**9])
def test_a_consumed_position_that_is_not_a_sample_count_is_refused(corpus, consumed):
    ds = CurriculumDataset(config(corpus), seed=7)
    state = {**ds.state_dict(consumed=3), "consumed": consumed}
    with pytest.raises(ResumeMismatchError, match="consumed position"):
        CurriculumDataset(config(corpus), seed=7).load_state_dict(state)


@pytest.mark.parametrize("index", ["3", 1.0, True])
def test_a_sample_index_that_is_not_an_integer_is_refused(corpus, index):
    ds = CurriculumDataset(config(corpus), seed=7)
    with pytest.raises(TypeError, match="integers"):
        ds[index]
    numpy_index = np.int64(3)  # numpy integers are integers: accepted
    assert ds[3]["input_ids"].shape == ds[numpy_index]["input_ids"].shape  # pyright: ignore[reportArgumentType]


def test_a_halted_state_loaded_with_the_same_policy_halts_at_once_and_a_new_policy_continues(corpus):
    ds = CurriculumDataset(config(corpus), seed=7)
    state = ds.state_dict(consumed=ds.halt_position)
    with pytest.raises(BucketExhausted, match="bucket 'b'"):
        CurriculumDataset(config(corpus), seed=7).load_state_dict(state)
    renormalising = CurriculumDataset(config(corpus, policy="renormalise"), seed=7)
    renormalising.load_state_dict(state)  # continues from the halt position with the new policy
    renormalising.__getitems__(list(range(ds.halt_position, ds.halt_position + 8)))
    # but not once the run went past the point where the schedules part
    late = renormalising.state_dict(consumed=len(renormalising) - 1)
    with pytest.raises(ResumeMismatchError, match="policy changed"):
        CurriculumDataset(config(corpus, policy="repeat", max_repetition=2), seed=7).load_state_dict(late)


def test_no_curriculum_reads_every_bucket_once_in_proportion_to_its_tokens(corpus):
    ds = CurriculumDataset(CurriculumConfig(path=corpus, seq_len=SEQ_LEN, packing=False), seed=1)
    assert len(ds) == 300 + 200 + 400
    _, bucket, index = ds.locate(np.arange(len(ds)))
    assert np.bincount(bucket).tolist() == [300, 200, 400]
    assert len(set(zip(bucket.tolist(), index.tolist(), strict=True))) == len(ds)
    assert ds.halt is None
    # proportional all along: after a third of the samples, about a third of each bucket
    third = np.bincount(bucket[:300], minlength=3)
    assert np.abs(third - np.array([100, 200 / 3, 400 / 3])).max() < 2


def test_packing_buckets_count_non_padding_tokens(corpus, tmp_path):
    cfg = CurriculumConfig(
        path=corpus,
        seq_len=64,
        packing=True,
        curriculum=(Phase(duration_tokens=5000, mix={"a": 0.5, "c": 0.5}),),
    )
    ds = CurriculumDataset(cfg, seed=3, plan_cache_dir=tmp_path / "plans")
    batch = ds.__getitems__(list(range(8))).batched
    assert {"input_ids", "labels", "doc_ids", "position_ids", "bucket"} <= set(batch)
    counted = ds.budget_tokens(np.arange(8))
    padding = (batch["doc_ids"] == batch["doc_ids"].max(dim=1, keepdim=True).values) & (batch["labels"] == -100)
    assert (counted <= 64).all()
    assert ds.schedule.total_tokens >= 5000
    assert int(ds.budget_tokens(np.arange(len(ds))).sum()) == pytest.approx(ds.schedule.total_tokens, rel=0.02)
    assert padding.any() or (counted == 64).all()


def test_val_dataset_is_the_val_twin_in_order(corpus):
    ds = CurriculumDataset(config(corpus, policy="renormalise"), seed=7)
    val = ds.val_dataset("c")
    assert len(val) == 4
    assert [val[i]["input_ids"][0].item() // WINDOW for i in range(4)] == [0, 1, 2, 3]


def test_workers_receive_no_per_document_index(tmp_path):
    import pickle

    from curriculum_helpers import make_corpus

    root = make_corpus(tmp_path / "data", {"a": 1500, "b": 1500}, doc_length=2)  # 12,750 documents per bucket
    ds = CurriculumDataset(CurriculumConfig(path=root, seq_len=SEQ_LEN, packing=False), seed=0)
    size = len(pickle.dumps(ds))
    assert size < 50_000, size  # the entry offsets alone would be 2 x 102 kB
    clone = pickle.loads(pickle.dumps(ds))
    assert torch.equal(clone[17]["input_ids"], ds[17]["input_ids"])


def test_a_short_list_of_ints_takes_the_python_path_with_the_same_samples_and_errors(corpus):
    """DataLoader batches (lists of ints) skip numpy per call; arrays take the vectorised path."""
    ds = CurriculumDataset(config(corpus, policy="renormalise"), seed=7)
    getitems: Any = ds.__getitems__  # arrays and wrong types on purpose
    rng = np.random.default_rng(3)
    for size in (1, 8, 64):
        positions = rng.integers(-len(ds), len(ds), size=size)
        fast = getitems(positions.tolist()).batched  # Python ints, negatives from the end
        vectorised = getitems(positions).batched  # an int64 array
        assert fast.keys() == vectorised.keys()
        assert all(torch.equal(fast[key], vectorised[key]) for key in fast)
        assert fast["bucket"].dtype == torch.int64
    for bad in ([len(ds)], [0, -len(ds) - 1]):
        with pytest.raises(IndexError, match="outside"):
            getitems(bad)
        with pytest.raises(IndexError, match="outside"):
            getitems(np.asarray(bad))
    for huge in ([2**64 - 1], [2**64], [2**63, -1]):  # beyond int64: never wrapped to a valid position
        with pytest.raises(IndexError, match="outside"):
            getitems(huge)  # the Python path
        with pytest.raises(IndexError, match="outside"):
            getitems(huge * 65)  # too long for it: the numpy path
    with pytest.raises(IndexError, match="outside"):
        getitems(np.asarray([2**64 - 1], dtype=np.uint64))
    with pytest.raises(TypeError, match="must be integers"):
        getitems([1.0])
    with pytest.raises(TypeError, match="must be integers"):
        getitems([True])
