"""The assembled flow from S3 under torchrun with faults: what test_remote_elastic does not inject.

Every request of every rank and DataLoader worker goes through the fault proxy, which answers GETs
with 503 bursts and connection resets spread over the run; the caches are bounded below the data
(TOKENLOOM_CACHE_LIMIT, small blocks through TOKENLOOM_BLOCK_SIZE) and each segment is a new node
with an empty cache directory.

- curriculum (gloo ranks started with torchrun's environment, without its agent, as in test_remote_elastic):
  2 ranks x 2 workers save the state one step before the phase boundary and are SIGKILLed
  while they work on across it; 3 ranks x 1 worker resume on a new node to the end. Every position
  exactly once, each from the bucket the schedule names, with the local copy's tokens.
- eval-broadcast: rank 0 of 3 builds the eval set from the bucket, every rank receives the local copy's
  rows and one loss; a missing prefix is rank 0's named error on every rank.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import orjson
import pytest
import yaml
from test_remote_elastic import EOS, records, upload_tree, wait_for_checkpoint
from test_remote_elastic import start_job as start_ranks
from torchrun_helpers import finish_job, start_job

from tokenloom.curriculum import CurriculumDataset
from tokenloom.eval_broadcast import PathEvalSource, broadcast_eval_set
from tokenloom.formats import open_writer
from tokenloom.testing.servers import FaultProxy

SEQ_LEN, BATCH = 32, 4
BLOCK = 4096
#: 503 bursts (3 in a row: one request retried 3 times) and resets, spread over the GETs of the run
FAULTS = (["503", "503", "503", *[""] * 20, "reset", *[""] * 20]) * 20


@pytest.fixture
def faulty_s3(seaweed, monkeypatch):
    """The jobs reach S3 only through a fault proxy; ``node(i)`` gives node i an empty, bounded cache."""
    proxy = FaultProxy(seaweed.endpoint)
    for name, value in {
        **seaweed.env, "AWS_ENDPOINT_URL": proxy.url, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1",
        "TOKENLOOM_BLOCK_SIZE": str(BLOCK),
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    yield proxy
    proxy.close()


def write_buckets(root: Path, samples: dict[str, int]) -> None:
    """train/<name> with ``samples`` windows of tokens (distinct per bucket and place), val/<name> with 4."""
    for split, sizes in (("train", samples), ("val", dict.fromkeys(samples, 4))):
        for b, (name, count) in enumerate(sorted(sizes.items())):
            tokens = 1 + (b * 20_000 + np.arange(count * (SEQ_LEN + 1), dtype=np.int64)) % 60_000
            tokens[49::50] = EOS
            with open_writer(root / split / name, dtype="uint16", eos_id=EOS, vocab_size=65_536) as writer:
                for start in range(0, len(tokens), 50):
                    writer.add(tokens[start : start + 50])


def _node(monkeypatch, tmp_path: Path, number: int, limit: int) -> Path:
    cache = tmp_path / f"node{number}-cache"
    monkeypatch.setenv("TOKENLOOM_CACHE_DIR", str(cache))
    monkeypatch.setenv("TOKENLOOM_CACHE_LIMIT", str(limit))
    return cache


def _cached_bytes(cache: Path) -> int:
    return sum(p.stat().st_size for p in cache.rglob("*") if p.is_file() and "readers" not in p.parts)


def test_curriculum_from_s3_with_faults_killed_before_a_phase_boundary_resumes_exactly_once(
    seaweed, faulty_s3, monkeypatch, tmp_path
):
    local = tmp_path / "data"
    write_buckets(local, {"a": 1500, "b": 1200, "c": 1800})
    data_bytes = sum(p.stat().st_size for p in (local / "train").rglob("*.bin"))
    url = upload_tree(seaweed, local)
    phases = [{"duration_tokens": 1600, "mix": {"a": 1, "b": 1}}, {"duration_tokens": 2400, "mix": {"b": 1, "c": 2}}]
    data = {"max_length": SEQ_LEN, "packing": False, "allow_bucket_exhaustion": False, "curriculum": phases}
    config = tmp_path / "remote.yaml"
    config.write_text(yaml.safe_dump({"data": {"path": url, **data}}))
    (tmp_path / "local.yaml").write_text(yaml.safe_dump({"data": {"path": str(local), **data}}))
    reference = CurriculumDataset(tmp_path / "local.yaml", seed=1234)
    n = len(reference)
    _, expected_bucket, _ = reference.locate(np.arange(n))
    boundary = int(reference.schedule.phase_bounds[0][1])
    ranks, workers = 2, 2
    step = boundary // (ranks * BATCH)  # the last step that ends at or before the phase boundary
    assert 0 < step * ranks * BATCH <= boundary < (step + 2) * ranks * BATCH < n
    limit = data_bytes * 2 // 3  # the cache holds two thirds of the train tokens at most
    checkpoint, run = tmp_path / "checkpoint.json", tmp_path / "run"
    common = ["--config", str(config), "--run-dir", str(run), "--checkpoint", str(checkpoint)]
    common += ["--batch-size", str(BATCH)]
    faulty_s3.faults = list(FAULTS)

    cache0 = _node(monkeypatch, tmp_path, 0, limit)
    out0 = tmp_path / "segment0"
    process = start_ranks(
        "curriculum_job.py", ranks, *common, "--out", str(out0), "--workers", str(workers),
        "--checkpoint-step", str(step), "--hang-after-checkpoint",
    )  # fmt: skip
    wait_for_checkpoint(process, checkpoint, step * ranks * BATCH, out0, ranks, step, "sampler")
    saved = orjson.loads(checkpoint.read_bytes())
    assert saved["sampler"]["consumed"] == step * ranks * BATCH <= boundary
    assert 0 < _cached_bytes(cache0) <= limit

    cache1 = _node(monkeypatch, tmp_path, 1, limit)  # a new node: nothing cached
    out1 = tmp_path / "segment1"
    code, output = finish_job(
        start_ranks("curriculum_job.py", 3, *common, "--out", str(out1), "--workers", "1", "--resume"), timeout=240
    )
    assert code == 0, output[-4000:]
    assert 0 < _cached_bytes(cache1) <= limit

    seen: dict[int, int] = {}
    for segment, last_step in ((out0, step), (out1, None)):
        for record in records(segment):
            if last_step is not None and record["step"] >= last_step:
                continue  # after the save: lost with the SIGKILL
            for position, bucket, first in zip(record["positions"], record["buckets"], record["first"], strict=True):
                assert position not in seen, f"position {position} consumed twice"
                seen[position] = bucket
                assert first == reference[position]["input_ids"][:2].tolist()  # the local copy's tokens
    assert sorted(seen) == list(range(n)), "a position was skipped"
    assert [seen[p] for p in range(n)] == expected_bucket.tolist()
    assert faulty_s3.injected["503"] >= 6 and faulty_s3.injected["reset"] >= 2, faulty_s3.injected


def test_eval_set_broadcast_from_s3_with_faults_under_torchrun(seaweed, faulty_s3, monkeypatch, tmp_path):
    local = tmp_path / "data"
    write_buckets(local, {"a": 30, "b": 20})
    url = upload_tree(seaweed, local)
    expected = broadcast_eval_set(PathEvalSource(local / "val" / "a"), seq_len=SEQ_LEN)  # one process, local
    _node(monkeypatch, tmp_path, 0, 1 << 20)
    faulty_s3.faults = list(FAULTS)
    out = tmp_path / "out"
    out.mkdir()
    missing = f"{url}/val/no-such-bucket"
    args = ["--good", f"{url}/val/a", "--bad", missing, "--out", str(out), "--seq-len", str(SEQ_LEN)]
    code, output = finish_job(start_job("eval_job.py", 3, *args), timeout=180)
    assert code != 0, output[-4000:]  # the ranks exit with the bad build's error
    results = [orjson.loads(p.read_bytes()) for p in sorted(out.glob("rank*.json"))]
    assert [r["rank"] for r in results] == [0, 1, 2], output[-4000:]
    assert {r["digest"] for r in results} == {hashlib.sha256(expected.numpy().tobytes()).hexdigest()}
    assert results[0]["rows"] == len(expected)
    assert sum(r["tokens"] for r in results) == results[0]["whole_tokens"] > 0
    assert len({r["loss"] for r in results}) == 1
    for r in results:
        assert r["bad"]["type"] == "EvalBuildError", r
        assert "no-such-bucket" in r["bad"]["message"], r
    assert faulty_s3.injected["503"] >= 1, faulty_s3.injected
