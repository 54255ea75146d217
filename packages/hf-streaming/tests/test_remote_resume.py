"""Exact and elastic resume with every source on S3 and faults injected: real SeaweedFS, a real fault proxy,
real DataLoader workers, real SIGKILLs, the doc_index oracle."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from test_resume import (
    assert_exactly_once,
    assert_same_records,
    dataset_kwargs,
    kill_at_step_10_and_resume,
    run_elastic_schedule,
)

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

    resumed = kill_at_step_10_and_resume(tmp_path, base, lambda: setattr(fault_proxy, "faults", list(FAULTS)))
    # the remote stream with faults, killed and resumed, is the local stream's bytes
    assert_same_records(resumed, reference)
    assert not fault_proxy.faults and sum(fault_proxy.injected.values()) == 2 * len(FAULTS)


@pytest.mark.slow
def test_elastic_schedule_from_s3_with_faults_is_exactly_once(tmp_path, corpus, tokenizer_dir, seaweed, fault_proxy):
    """1 rank x 0 workers -> 2 x 2 -> 3 x 1 -> 1 x 3, each segment SIGKILLed between checkpoints, faults in each."""
    kwargs = remote_kwargs(seaweed, fault_proxy, corpus, tokenizer_dir, seed=11)
    segments, injected = run_elastic_schedule(tmp_path, kwargs, fault_proxy, FAULTS)
    assert injected >= 3 * len(FAULTS)  # faults really hit the segments' reads
    assert_exactly_once(segments, corpus, tokenizer_dir)
