"""Exact and elastic resume, proven with real DataLoader workers, real SIGKILLs and a doc_index oracle."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _hfs_oracle import compare, expected_documents, read_log, rebuild

DRIVER = Path(__file__).with_name("_hfs_driver.py")


def dataset_kwargs(files, tokenizer_dir, **extra):
    kwargs = {
        "dataset_name": "json",
        "split": "train",
        "text_field": "text",
        "seq_len": 24,
        "tokenizer_path": str(tokenizer_dir),
        "data_files": files,
        "seed": 7,
        "shuffle_buffer_size": 8,
        "with_provenance": True,
        "encode_batch_size": 5,
    }
    kwargs.update(extra)
    return kwargs


def run_driver(tmp: Path, name: str, config: dict, *, expect_kill: bool = False) -> Path:
    log = tmp / f"{name}.log"
    config = {**config, "log": str(log)}
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": str(DRIVER.parent)}
    proc = subprocess.run(
        [sys.executable, str(DRIVER), str(path)], capture_output=True, text=True, timeout=240, env=env
    )
    if expect_kill:
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    else:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return log


def committed_step(state_dir: Path) -> int:
    return int((state_dir / "latest").read_text())


@pytest.mark.slow
def segment_config(kwargs: dict, state: Path, index: int, world: int, workers: int, save_every: int, kill_at: int):
    """The driver's config for segment ``index`` of an elastic schedule (resumed from the merged states after
    the first); saving every ``save_every`` steps and killed at step ``kill_at`` unless that is 0."""
    config = {
        "dataset": kwargs,
        "world_size": world,
        "num_workers": workers,
        "batch_size": 2,
        "state_dir": str(state),
        "resume": "none" if index == 0 else "merge",
        "tag": f"seg{index}-",
    }
    if kill_at:
        config.update(save_every=save_every, kill_at_step=kill_at)
    return config


def kill_at_step_10_and_resume(tmp_path: Path, base: dict, before_each=None) -> list:
    """Run ``base`` saving every 4 steps, SIGKILL it at step 10, resume it on the same topology (calling
    ``before_each()`` before each run): the records of both runs, the killed one's up to its committed step 8."""
    state = tmp_path / "state"
    state.mkdir()
    if before_each is not None:
        before_each()
    first = run_driver(
        tmp_path, "killed", {**base, "state_dir": str(state), "save_every": 4, "kill_at_step": 10}, expect_kill=True
    )
    step = committed_step(state)
    assert step == 8
    if before_each is not None:
        before_each()
    second = run_driver(tmp_path, "resumed", {**base, "state_dir": str(state), "resume": "same"})
    return read_log(first, up_to_step=step) + read_log(second)


def assert_same_records(resumed: list, reference: list) -> None:
    """The same (step, rank, input_ids, labels, doc_index) rows, in step and rank order."""

    def key(records):
        return [(r["step"], r["rank"], r["input_ids"], r["labels"], r["doc_index"]) for r in records]

    assert len(reference) > 20
    assert key(sorted(resumed, key=lambda r: (r["step"], r["rank"]))) == key(
        sorted(reference, key=lambda r: (r["step"], r["rank"]))
    )


def run_elastic_schedule(tmp_path: Path, kwargs: dict, fault_proxy=None, faults=()) -> tuple[list, int]:
    """1 rank x 0 workers -> 2 x 2 -> 3 x 1 -> 1 x 3, each segment but the last SIGKILLed between checkpoints
    (each with ``faults`` armed on the fault proxy, if given): each segment's records up to its last committed
    step, and how many faults were injected."""
    state = tmp_path / "state"
    state.mkdir()
    schedule = [(1, 0, 3, 7), (2, 2, 2, 5), (3, 1, 2, 3), (1, 3, 0, 0)]
    segments, injected = [], 0
    for index, (world, workers, save_every, kill_at) in enumerate(schedule):
        config = segment_config(kwargs, state, index, world, workers, save_every, kill_at)
        if fault_proxy is not None:
            fault_proxy.faults = list(faults)
        log = run_driver(tmp_path, f"segment{index}", config, expect_kill=bool(kill_at))
        if fault_proxy is not None:
            injected += len(faults) - len(fault_proxy.faults)
        segments.append(read_log(log, up_to_step=committed_step(state) if kill_at else None))
    return segments, injected


def assert_exactly_once(segments: list, corpus, tokenizer_dir: Path) -> None:
    """The segments together are every document once, and a resume really fell inside a document."""
    assert compare(expected_documents(corpus, tokenizer_dir, eos_id=0), rebuild(segments)) == []
    first_ids = {d for r in segments[0] for row in r["doc_index"] for d in row}
    second_ids = {d for r in segments[1] for row in r["doc_index"] for d in row}
    assert (first_ids & second_ids) - {-1}  # some document is split across the first two segments


def test_sigkill_resume_same_topology_is_bit_exact(tmp_path, corpus, tokenizer_dir, packed_reference):
    kwargs = dataset_kwargs(corpus, tokenizer_dir, pack_sequences=True)
    base = {"dataset": kwargs, "world_size": 2, "num_workers": 2, "batch_size": 3}
    reference = packed_reference  # the same run on the same bytes, made once per session

    assert_same_records(kill_at_step_10_and_resume(tmp_path, base), reference)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [11])
def test_elastic_schedule_exactly_once(tmp_path, corpus, tokenizer_dir, seed):
    """1 rank x 0 workers -> 2 x 2 -> 3 x 1 -> 1 x 3, each segment SIGKILLed between checkpoints."""
    segments, _ = run_elastic_schedule(tmp_path, dataset_kwargs(corpus, tokenizer_dir, seed=seed))
    assert_exactly_once(segments, corpus, tokenizer_dir)
