"""broadcast_eval_set across real gloo processes: equal sets, failures, killed and stalled ranks, exact loss."""

from __future__ import annotations

import math

import pytest

WORLDS = (1, 2, 3, 4)


@pytest.fixture(scope="module")
def suites(request):
    return {}


def _suite(run_ranks, suites, world):
    if world not in suites:
        results = run_ranks(world, "suite", timeout=240)
        for rank, result in enumerate(results):
            assert result is not None, f"rank {rank} wrote no result"
            assert "crash" not in result, result.get("crash")
        suites[world] = results
    return suites[world]


@pytest.mark.parametrize("world", WORLDS)
def test_every_rank_receives_the_same_set(run_ranks, suites, world):
    results = _suite(run_ranks, suites, world)
    for case in ("equal", "rows_from_last", "empty", "short", "short_dropped", "slow_build"):
        outcomes = [r[case] for r in results]
        assert all(o["ok"] for o in outcomes), (case, outcomes)
        values = [o["value"] for o in outcomes]
        assert len({v["sha256"] for v in values}) == 1, (case, values)
        assert {v["shape"][0] for v in values} == {values[0]["shape"][0]}
    equal = [r["equal"]["value"] for r in results]
    assert equal[0]["shape"] == [313, 16] and equal[0]["tail_padding"] == 16 - 11  # remainder kept, padded
    assert equal[0]["dtype"] == "torch.uint16" and equal[0]["eos_id"] == 999 and equal[0]["vocab_size"] == 1000
    assert equal[0]["origin"] == "built" and all(v["origin"] == "received" for v in equal[1:])
    rows_from_last = [r["rows_from_last"]["value"] for r in results]
    assert rows_from_last[-1]["origin"] == "built" and rows_from_last[0]["shape"] == [300, 16]
    assert results[0]["empty"]["value"]["shape"] == [0, 16]
    assert results[0]["short"]["value"]["shape"] == [1, 16] and results[0]["short"]["value"]["tail_padding"] == 11
    assert results[0]["short_dropped"]["value"]["shape"] == [0, 16]
    assert results[0]["slow_build"]["value"]["sha256"] == equal[0]["sha256"]  # 1.5 s build, 0.5 s timeout


@pytest.mark.parametrize("world", WORLDS)
def test_a_failing_build_is_the_same_error_everywhere(run_ranks, suites, world):
    results = _suite(run_ranks, suites, world)
    failures = [r["failure"] for r in results]
    assert not any(f["ok"] for f in failures)
    assert {f["type"] for f in failures} == {"EvalBuildError"}
    assert all("DataError" in f["bases"] for f in failures)
    assert len({f["message"] for f in failures}) == 1
    assert "RuntimeError: tokenizer exploded on document 17" in failures[0]["message"]
    assert len(failures[0]["message"].encode()) < 4096 + 300  # bounded message (plus the hint)
    assert all(f["seconds"] < 30 for f in failures)
    for case, text in (("three_d", "3-D"), ("too_large_id", "TokenRangeError"), ("wrong_row_len", "seq_len + 1")):
        outcomes = [r[case] for r in results]
        assert {o["type"] for o in outcomes} == {"EvalBuildError"}, outcomes
        assert all(text in o["message"] for o in outcomes), outcomes


@pytest.mark.parametrize("world", WORLDS)
def test_a_corrupted_receive_on_one_rank_is_an_error_on_every_rank(run_ranks, suites, world):
    outcomes = [r["corrupted"] for r in _suite(run_ranks, suites, world)]
    if world == 1:
        assert outcomes[0]["ok"]  # nobody receives
        return
    assert {o["type"] for o in outcomes} == {"EvalTransferError"}, outcomes
    assert "received rows hash to" in outcomes[-1]["message"]
    assert all("1 rank(s)" in o["message"] for o in outcomes[:-1])


@pytest.mark.parametrize("world", WORLDS)
def test_bad_arguments_fail_on_every_rank(run_ranks, suites, world):
    results = _suite(run_ranks, suites, world)
    assert {r["src_outside"]["type"] for r in results} == {"ConfigError"}
    assert all("outside the group" in r["src_outside"]["message"] for r in results)
    mismatch = [r["mismatch"] for r in results]
    if world == 1:
        assert mismatch[0]["ok"]
    else:
        assert {m["type"] for m in mismatch} == {"ConfigError"}
        assert all("chunk_bytes (1000 .. 1001)" in m["message"] for m in mismatch)


@pytest.mark.parametrize("world", WORLDS)
def test_a_subgroup_broadcasts_among_its_members_and_refuses_the_others(run_ranks, suites, world):
    results = _suite(run_ranks, suites, world)
    equal = results[0]["equal"]["value"]["sha256"]
    members = [r["subgroup"] for r in results if r["subgroup_member"]]
    others = [r["subgroup"] for r in results if not r["subgroup_member"]]
    assert len(members) == (world - 1 if world >= 3 else 1) and len(others) == world - len(members)
    assert all(m["ok"] and m["value"]["sha256"] == equal for m in members), members
    assert members[0]["value"]["origin"] == "built"  # group rank 0 (global 1 with 3+ ranks) built it
    assert all(m["value"]["origin"] == "received" for m in members[1:])
    assert all(o["type"] == "ConfigError" and "not a member" in o["message"] for o in others), others


def test_eval_loss_is_the_same_on_1_2_3_and_4_ranks(run_ranks, suites):
    losses = {}
    reference_labels = None
    for world in WORLDS:
        results = _suite(run_ranks, suites, world)
        assert sum(r["rows_here"] for r in results) == 313  # no row dropped or duplicated
        rows = [r["rows_here"] for r in results]
        assert max(rows) - min(rows) <= 1
        labels = sum(r["labels_here"] for r in results)
        losses[world] = [r["loss"] for r in results]
        assert len(set(losses[world])) == 1  # every rank holds the reduced value
        losses[world] = losses[world][0]
        if world == 1:
            reference_labels = labels
        assert labels == reference_labels
    assert all(math.isfinite(v) for v in losses.values())
    for world in WORLDS:
        assert losses[world] == pytest.approx(losses[1], rel=1e-12, abs=0)


def test_a_killed_receiver_is_an_error_on_the_others_within_the_timeout(run_ranks):
    results = run_ranks(3, "kill_receiver", {"victim": 1, "timeout": 10}, timeout=120)
    assert results[1] is None  # the victim died before writing anything
    for rank in (0, 2):
        outcome = results[rank]["transfer"]
        assert not outcome["ok"] and outcome["type"] == "EvalTransferError", outcome
        assert outcome["seconds"] < 10 + 5


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_a_dead_or_stalled_source_is_an_error_within_the_timeout(run_ranks, how):
    timeout = 3
    results = run_ranks(2, "source_dies", {"signal": how, "timeout": timeout}, timeout=90, stopped=(0,))
    assert results[0] is None
    outcome = results[1]["transfer"]
    assert not outcome["ok"] and outcome["type"] == "EvalTransferError", outcome
    assert outcome["seconds"] < 0.3 + timeout + 5
    if how == "SIGSTOP":  # alive but silent: only the timeout can tell
        assert "timed out" in outcome["message"] or "did not complete" in outcome["message"]
        assert outcome["seconds"] >= timeout - 0.5


def test_second_start_broadcasts_from_the_cache_and_shared_filesystem_maps_it(
    run_ranks, tokenizer_dir, jsonl, tmp_path
):
    params = {"jsonl": str(jsonl), "tokenizer": str(tokenizer_dir), "cache_dir": str(tmp_path / "cache")}
    first = run_ranks(2, "hf_cache", {**params, "shared": [False]}, timeout=180)
    later = run_ranks(2, "hf_cache", {**params, "shared": [False, True]}, timeout=180)  # a second start
    assert all(r is not None and "crash" not in r for r in first + later), (first, later)
    ((built, received),) = zip(*(r["runs"] for r in first), strict=True)
    second, shared = zip(*(r["runs"] for r in later), strict=True)
    for source, receiver in (built, received), second, shared:
        assert source["sha256"] == receiver["sha256"] == built["sha256"]
        assert receiver["tokenized"] == 0  # a receiving rank never tokenizes
    assert built["origin"] == "built" and built["tokenized"] == 6 and received["origin"] == "received"
    assert second[0]["origin"] == "cache" and second[0]["tokenized"] == 0 and second[1]["origin"] == "received"
    assert shared[0]["origin"] == "cache" and shared[1]["origin"] == "mapped"
    assert len(list((tmp_path / "cache").iterdir())) == 1
    assert sum(map(sum, built["rows"])) > 0


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(_gpus() < 2, reason="the NCCL path needs a CUDA device and 2+ GPUs; this machine has fewer")
def test_nccl_path_on_two_gpus(run_ranks):
    results = run_ranks(2, "nccl", {"backend": "nccl"}, timeout=180)
    assert all(r is not None and "crash" not in r for r in results), results
    assert all(r["equal"]["ok"] for r in results)
    assert results[0]["equal"]["value"]["sha256"] == results[1]["equal"]["value"]["sha256"]
    assert {r["failure"]["type"] for r in results} == {"EvalBuildError"}
    assert all("no such split" in r["failure"]["message"] for r in results)
