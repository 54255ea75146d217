"""Exact and elastic resume with every source on S3 and faults injected: real SeaweedFS, a real fault proxy,
real DataLoader workers, real SIGKILLs, the doc_index oracle."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from _hfs_oracle import compare, expected_documents, read_log, rebuild
from test_resume import committed_step, dataset_kwargs, run_driver

FAULTS = ["503", "reset", "truncate", "503", "truncate", "reset"]
# the default retries (8 per request, enough for all six faults on one request) without the default 0.2 s first
# backoff doubling per retry: the retry paths are the same, the jittered sleeps between them were seconds a segment
RETRIES = {"max_retries": 8, "backoff": 0.01}


def upload(seaweed, files: list[str]) -> list[str]:
    prefix = f"resume-{uuid.uuid4().hex[:8]}"
    for path in files:
        seaweed.put(f"{prefix}/{Path(path).name}", Path(path).read_bytes())
    return [f"s3://{seaweed.bucket}/{prefix}/{Path(p).name}" for p in files]


def remote_kwargs(seaweed, fault_proxy, corpus, tokenizer_dir, **extra):
    urls = upload(seaweed, corpus)
    options = seaweed.storage_options(endpoint=fault_proxy.url)
    return dataset_kwargs(urls, tokenizer_dir, storage_options=options, retries=RETRIES, **extra)


@pytest.mark.slow
def test_sigkill_resume_from_s3_is_bit_exact(tmp_path, corpus, tokenizer_dir, seaweed, fault_proxy, packed_reference):
    kwargs = remote_kwargs(seaweed, fault_proxy, corpus, tokenizer_dir, pack_sequences=True)
    base = {"dataset": kwargs, "world_size": 2, "num_workers": 2, "batch_size": 3}
    reference = packed_reference  # the local stream of the same bytes, uninterrupted (one run per session)

    state = tmp_path / "state"
    state.mkdir()
    fault_proxy.faults = list(FAULTS)
    first = run_driver(
        tmp_path, "killed", {**base, "state_dir": str(state), "save_every": 4, "kill_at_step": 10}, expect_kill=True
    )
    step = committed_step(state)
    assert step == 8
    fault_proxy.faults = list(FAULTS)
    second = run_driver(tmp_path, "resumed", {**base, "state_dir": str(state), "resume": "same"})
    resumed = read_log(first, up_to_step=step) + read_log(second)

    def key(records):
        return [(r["step"], r["rank"], r["input_ids"], r["labels"], r["doc_index"]) for r in records]

    assert len(reference) > 20
    # the remote stream with faults, killed and resumed, is the local stream's bytes
    assert key(sorted(resumed, key=lambda r: (r["step"], r["rank"]))) == key(
        sorted(reference, key=lambda r: (r["step"], r["rank"]))
    )
    assert not fault_proxy.faults and sum(fault_proxy.injected.values()) == 2 * len(FAULTS)


@pytest.mark.slow
def test_elastic_schedule_from_s3_with_faults_is_exactly_once(tmp_path, corpus, tokenizer_dir, seaweed, fault_proxy):
    """1 rank x 0 workers -> 2 x 2 -> 3 x 1 -> 1 x 3, each segment SIGKILLed between checkpoints, faults in each."""
    kwargs = remote_kwargs(seaweed, fault_proxy, corpus, tokenizer_dir, seed=11)
    state = tmp_path / "state"
    state.mkdir()
    schedule = [(1, 0, 3, 7), (2, 2, 2, 5), (3, 1, 2, 3), (1, 3, 0, 0)]
    segments = []
    injected = 0
    for index, (world, workers, save_every, kill_at) in enumerate(schedule):
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
        fault_proxy.faults = list(FAULTS)
        log = run_driver(tmp_path, f"segment{index}", config, expect_kill=bool(kill_at))
        injected += len(FAULTS) - len(fault_proxy.faults)
        segments.append(read_log(log, up_to_step=committed_step(state) if kill_at else None))
    expected = expected_documents(corpus, tokenizer_dir, eos_id=0)
    got = rebuild(segments)
    assert compare(expected, got) == []
    assert injected >= 3 * len(FAULTS)  # faults really hit the segments' reads
    first_ids = {d for r in segments[0] for row in r["doc_index"] for d in row}
    second_ids = {d for r in segments[1] for row in r["doc_index"] for d in row}
    assert (first_ids & second_ids) - {-1}
