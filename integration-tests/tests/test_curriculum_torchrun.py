"""The curriculum on real ranks: a SIGKILL just before a phase boundary, a resume on another
topology, and a bucket that runs dry under the halt policy.

Every bucket's tokens say where they come from (bucket b's token k is b * SPAN + k, except
that every 50th is the EOS ending a document, so a sample's first non-EOS token names its
bucket and its index in the bucket), which makes the
schedule (CurriculumDataset.locate, computed here in the test process) the oracle: every
global position of the curriculum is consumed exactly once over the crashed and the
resumed job, each is the sample the schedule puts there, and the realised mix of each
phase is within the schedule's bound of its target.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import orjson
import pytest
import yaml
from torchrun_helpers import finish_job, kill_job, start_job, tokenloom_cli

from tokenloom.curriculum import CurriculumDataset, build_plan, read_run_status
from tokenloom.formats import open_writer

SEQ_LEN, WINDOW, SPAN, EOS = 16, 17, 20_000, 65_535
BATCH, SEED = 4, 1234
HALT_EXIT = 3


def write_buckets(root: Path, samples: dict[str, int], val_samples: int = 6) -> None:
    """PATH/train/<bucket>/ and PATH/val/<bucket>/, tokenloom's native layout, documents of 50 tokens."""
    for split, sizes in (("train", samples), ("val", dict.fromkeys(samples, val_samples))):
        for b, (name, count) in enumerate(sorted(sizes.items())):
            tokens = b * SPAN + np.arange(count * WINDOW, dtype=np.int64)
            assert tokens.max() < (b + 1) * SPAN
            tokens[49::50] = EOS
            tokens[-1] = EOS
            with open_writer(root / split / name, dtype="uint16", eos_id=EOS, vocab_size=65_536) as writer:
                for start in range(0, len(tokens), 50):
                    writer.add(tokens[start : start + 50])


def write_config(path: Path, phases: list[tuple[int, dict[str, float]]], *, exhaustion: bool = False) -> Path:
    block = {
        "data": {
            "path": "./data",
            "max_length": SEQ_LEN,
            "packing": False,
            "curriculum": [{"duration_tokens": tokens, "mix": mix} for tokens, mix in phases],
            "allow_bucket_exhaustion": exhaustion,
        }
    }
    path.write_text(yaml.safe_dump(block, sort_keys=False))
    return path


def records(out: Path) -> list[dict]:
    found = []
    for path in sorted(out.glob("rank*.jsonl")):
        found += [orjson.loads(line) for line in path.read_bytes().splitlines()]
    return found


def job_args(config: Path, root: Path, name: str, *extra: str) -> list[str]:
    return [
        "--config", str(config), "--out", str(root / name), "--run-dir", str(root / "run"),
        "--checkpoint", str(root / "checkpoint.json"), "--seed", str(SEED), "--batch-size", str(BATCH), *extra,
    ]  # fmt: skip


def check_against_schedule(ds: CurriculumDataset, consumed: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Exactly once, and each sample the one the schedule names; returns (positions, observed bucket ids)."""
    positions = np.asarray([p for r in consumed for p in r["positions"]], dtype=np.int64)
    two = np.asarray([f for r in consumed for f in r["first"]], dtype=np.int64)
    first = np.where(two[:, 0] == EOS, two[:, 1], two[:, 0])  # never two EOS in a row
    reported = np.asarray([b for r in consumed for b in r["buckets"]], dtype=np.int64)
    assert sorted(positions.tolist()) == list(range(len(ds))), "not every position exactly once"
    bucket, index = first // SPAN, (first % SPAN) // WINDOW  # from the tokens themselves
    assert np.array_equal(bucket, reported)
    _, planned_bucket, planned_index = ds.locate(positions)
    assert np.array_equal(bucket, planned_bucket) and np.array_equal(index, planned_index % (SPAN // WINDOW))
    assert len(set(zip(bucket.tolist(), index.tolist(), strict=True))) == len(positions)
    return positions, bucket


def realised_mix(ds: CurriculumDataset, positions: np.ndarray, buckets: np.ndarray, start: int, end: int) -> dict:
    inside = (positions >= start) & (positions < end)
    counts = np.bincount(buckets[inside], minlength=len(ds.buckets))
    return {name: counts[b] / inside.sum() for b, name in enumerate(ds.buckets)}


def test_sigkill_just_before_a_phase_boundary_then_three_ranks_one_worker(tmp_path: Path) -> None:
    write_buckets(tmp_path / "data", {"a": 400, "b": 400, "c": 400})
    phases = [(3_200, {"a": 0.5, "b": 0.5}), (4_800, {"a": 0.2, "b": 0.3, "c": 0.5})]
    config = write_config(tmp_path / "curriculum.yaml", phases)
    ds = CurriculumDataset(config, seed=SEED)
    (_, boundary), _ = ds.schedule.phase_bounds
    global_batch = 2 * BATCH
    checkpoint_step = boundary // global_batch - 1  # the last step that ends before phase 2 starts
    assert 0 < boundary - checkpoint_step * global_batch <= 2 * global_batch

    crashed = start_job(
        "curriculum_job.py", 2,
        *job_args(config, tmp_path, "crashed", "--workers", "2", "--checkpoint-step", str(checkpoint_step),
                  "--hang-after-checkpoint"),
    )  # fmt: skip
    checkpoint = tmp_path / "checkpoint.json"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        past = {r["rank"] for r in records(tmp_path / "crashed") if r["step"] > checkpoint_step}
        if checkpoint.exists() and past == {0, 1}:
            break  # both ranks are past the checkpoint (inside phase 2): kill mid-flight
        if crashed.poll() is not None:
            pytest.fail("the job ended before it could be killed: " + crashed.stdout.read().decode()[-4000:])
        time.sleep(0.2)
    else:
        kill_job(crashed)
        pytest.fail("no checkpoint within 180 s")
    kill_job(crashed)
    assert crashed.returncode != 0
    saved = orjson.loads(checkpoint.read_bytes())
    assert saved["sampler"]["consumed"] == checkpoint_step * global_batch < boundary

    code, output = finish_job(
        start_job("curriculum_job.py", 3, *job_args(config, tmp_path, "resumed", "--workers", "1", "--resume"))
    )
    assert code == 0, output[-4000:]

    before = [r for r in records(tmp_path / "crashed") if r["step"] < checkpoint_step]
    after = records(tmp_path / "resumed")
    assert {r["world"] for r in after} == {3}
    assert any(p >= boundary for r in records(tmp_path / "crashed") for p in r["positions"])  # it got into phase 2
    positions, buckets = check_against_schedule(ds, before + after)

    plan = build_plan(ds)
    for phase, (start, end) in zip(plan["phases"], ds.schedule.phase_bounds, strict=True):
        realised = realised_mix(ds, positions, buckets, start, end)
        bound = (plan["discrepancy_samples"] + 1) / (end - start)
        total = sum(phase["mix"].values())
        for name in ds.buckets:
            assert abs(realised[name] - phase["mix"].get(name, 0) / total) <= bound, (phase["index"], realised)
    assert read_run_status(tmp_path / "run")["status"] == "completed"

    # the command line on every artefact of the flow
    for split in ("train", "val"):
        for name in ("a", "b", "c"):
            bucket = tmp_path / "data" / split / name
            result = tokenloom_cli("validate", str(bucket), "--deep")
            assert result.exit_code == 0, result.output
            result = tokenloom_cli("inspect", str(bucket), "--json")
            assert result.exit_code == 0, result.output
            assert orjson.loads(result.output)["tokens"] == (400 if split == "train" else 6) * WINDOW
    result = tokenloom_cli("validate", "--curriculum", str(config))
    assert result.exit_code == 0, result.output
    result = tokenloom_cli("curriculum", "plan", str(config), "--seed", str(SEED), "--plot", str(tmp_path / "plan.png"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "plan.png").read_bytes()[:4] == b"\x89PNG"
    result = tokenloom_cli("curriculum", "report", str(config), "--step", "10", "--global-batch-size", "8", "--json")
    assert result.exit_code == 0, result.output
    result = tokenloom_cli("curriculum", "status", str(tmp_path / "run"))
    assert result.exit_code == 0 and "completed" in result.output, result.output


def test_a_drained_bucket_halts_every_rank_at_one_step_and_stays_halted(tmp_path: Path) -> None:
    write_buckets(tmp_path / "data", {"a": 400, "b": 400, "c": 60})
    phases = [(3_200, {"a": 0.5, "b": 0.5}), (4_800, {"a": 0.2, "b": 0.3, "c": 0.5})]
    halting = write_config(tmp_path / "curriculum.yaml", phases)
    ds = CurriculumDataset(halting, seed=SEED, global_batch_size=2 * BATCH)
    halt_step = ds.halt_step()
    assert halt_step is not None and ds.halt_position < len(ds)
    result = tokenloom_cli("validate", "--curriculum", str(halting))
    assert result.exit_code == 1 and "shortfall" in result.output, result.output  # the validator saw it coming

    # 1. the halt: every rank stops at the planned step, the status is halted
    code, output = finish_job(
        start_job("curriculum_job.py", 2, *job_args(halting, tmp_path, "halted", "--workers", "1"))
    )
    assert code != 0, output[-4000:]
    halts = [orjson.loads(p.read_bytes()) for p in sorted((tmp_path / "halted").glob("halt-rank*.json"))]
    assert [h["rank"] for h in halts] == [0, 1]
    assert {h["step"] for h in halts} == {halt_step} and {h["bucket"] for h in halts} == {"c"}
    ran = records(tmp_path / "halted")
    last = {k: max(r["step"] for r in ran if r["rank"] == k) for k in (0, 1)}
    assert last == {0: halt_step - 1, 1: halt_step - 1}  # every step before the halt, none at or after it
    status = read_run_status(tmp_path / "run")
    assert status["status"] == "halted" and status["step"] == halt_step
    assert tokenloom_cli("curriculum", "status", str(tmp_path / "run")).exit_code == 3  # an auto-resume stops here

    # 2. the same config again: it halts at once, no step is taken, the status stays halted
    started = time.monotonic()
    code, output = finish_job(
        start_job("curriculum_job.py", 2, *job_args(halting, tmp_path, "again", "--workers", "1", "--resume"))
    )
    assert code != 0, output[-4000:]
    assert records(tmp_path / "again") == []
    assert {orjson.loads(p.read_bytes())["step"] for p in (tmp_path / "again").glob("halt-rank*.json")} == {halt_step}
    assert read_run_status(tmp_path / "run")["status"] == "halted"
    assert time.monotonic() - started < 120

    # 3. allow_bucket_exhaustion: true -> the rest renormalises and the run finishes
    renormalising = write_config(tmp_path / "renormalise.yaml", phases, exhaustion=True)
    code, output = finish_job(
        start_job(
            "curriculum_job.py", 2,
            *job_args(renormalising, tmp_path, "renormalised", "--workers", "1", "--resume", "--after-halt"),
        )
    )  # fmt: skip
    assert code == 0, output[-4000:]
    assert read_run_status(tmp_path / "run")["status"] == "completed"
    full = CurriculumDataset(renormalising, seed=SEED)
    consumed = records(tmp_path / "halted") + records(tmp_path / "renormalised")
    positions, buckets = check_against_schedule(full, consumed)
    (drain,) = full.schedule.drains
    plan = build_plan(full)
    (segment,) = [s for s in plan["segments"] if s["start_sample"] == drain.position]
    assert set(segment["weights"]) == {"a", "b"}  # c is gone; a : b stays 0.2 : 0.3, renormalised
    assert abs(segment["weights"]["a"] / sum(segment["weights"].values()) - 0.4) < 1e-9
    after_drain = realised_mix(full, positions, buckets, segment["start_sample"], segment["end_sample"])
    bound = (plan["discrepancy_samples"] + 1) / (segment["end_sample"] - segment["start_sample"])
    assert after_drain["c"] == 0
    assert abs(after_drain["a"] - 0.4) <= bound and abs(after_drain["b"] - 0.6) <= bound, (after_drain, bound)
    result = tokenloom_cli("validate", "--curriculum", str(renormalising))
    assert result.exit_code == 2, result.output  # a warning: the drain renormalises
