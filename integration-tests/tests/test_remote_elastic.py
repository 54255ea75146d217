"""The exactly-once oracle with the data on a real S3 server: save, SIGKILL, resume on other topologies.

Each segment is a real job (gloo ranks, real DataLoader workers; the ranks are started as torchrun would,
without its agent, which costs a torch import per segment) reading the data from
S3 (credentials and endpoint from the environment) into its own empty cache directory, as a new node
would: 1 rank x 0 workers -> 2 x 2 -> 3 x 1. A segment saves the data state at a random step, keeps
working and is SIGKILLed; the next resumes from the saved state. What a killed segment did after its
save is lost, as in a real crash. Over all segments every unit (a sample index for the plain sampler
over MemoryMappedDataset, a bucket sample for the curriculum) is consumed exactly once, at the
position an uninterrupted run puts it, with the bytes of the local copy of the data.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import orjson
import pytest
import yaml
from torchrun_helpers import JOBS, finish_job, kill_job

from tokenloom.curriculum import CurriculumDataset
from tokenloom.datasets import MemoryMappedDataset
from tokenloom.formats import open_writer
from tokenloom.sampler import ResumableDistributedSampler

SEQ_LEN, BATCH, EOS = 32, 4, 0
TOPOLOGIES = [(1, 0), (2, 2), (3, 1)]  # (ranks, DataLoader workers) per segment: a new node each time


_LAUNCH = """
import os, socket, subprocess, sys
nproc, job, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc)}
ranks = [
    subprocess.Popen([sys.executable, job, *args], env={**os.environ, **env, "RANK": str(r), "LOCAL_RANK": str(r)})
    for r in range(nproc)
]
codes = [rank.wait() for rank in ranks]
sys.exit(next((code for code in codes if code), 0))
"""


def start_job(job: str, nproc: int, *args: str) -> subprocess.Popen[bytes]:
    """``nproc`` gloo ranks of ``jobs/<job>`` with torchrun's environment, in one session (killed whole)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", _LAUNCH, str(nproc), str(JOBS / job), *args],
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def upload_tree(seaweed, local: Path) -> str:
    prefix = f"oracle-{uuid.uuid4().hex[:8]}"
    for path in sorted(local.rglob("*")):
        if path.is_file():
            seaweed.put(f"{prefix}/{path.relative_to(local).as_posix()}", path.read_bytes())
    return f"s3://{seaweed.bucket}/{prefix}"


def write_tokens(root: Path, seed: int, docs: int) -> None:
    rng = np.random.default_rng(seed)
    with open_writer(root, dtype="uint16", vocab_size=1000, eos_id=EOS, shard_size_tokens=3000) as writer:
        for _ in range(docs):
            writer.add(np.append(rng.integers(1, 1000, size=int(rng.integers(5, 90))), EOS))


@pytest.fixture
def node_env(seaweed, monkeypatch, tmp_path):
    """Point the jobs at the S3 server through the environment; ``node(i)`` gives node i an empty cache."""
    for name, value in {
        **seaweed.env, "AWS_ENDPOINT_URL": seaweed.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1",
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)

    def node(number: int) -> Path:
        cache = tmp_path / f"node{number}-cache"
        monkeypatch.setenv("TOKENLOOM_CACHE_DIR", str(cache))
        return cache

    return node


def wait_for_checkpoint(process, checkpoint: Path, consumed: int, out: Path, ranks: int, step: int, key: str):
    """Until the state at ``consumed`` is saved and every rank is past ``step``: then SIGKILL the job."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        saved = orjson.loads(checkpoint.read_bytes()) if checkpoint.exists() else None
        at = None if saved is None else (saved["sampler"] if key == "sampler" else saved)["consumed"]
        done = {r["rank"] for r in records(out) if r["step"] > step}
        if at == consumed and len(done) == ranks:
            kill_job(process)
            return
        if process.poll() is not None:
            pytest.fail("the job ended before it could be killed: " + process.stdout.read().decode()[-4000:])
        time.sleep(0.2)
    kill_job(process)
    pytest.fail("no checkpoint before the timeout")


def records(out: Path) -> list[dict]:
    return [orjson.loads(line) for path in sorted(out.glob("rank*.jsonl")) for line in path.read_bytes().splitlines()]


@pytest.mark.parametrize("schedule_seed", [3])
def test_sampler_over_s3_exactly_once_across_nodes_and_topologies(seaweed, node_env, tmp_path, schedule_seed):
    local = tmp_path / "tokens"
    write_tokens(local, seed=schedule_seed, docs=220)
    url = upload_tree(seaweed, local)
    reference = MemoryMappedDataset(local, SEQ_LEN, pack_sequences=True)
    n = len(reference)
    block = ["--order", "block", "--block-samples", "8", "--window-blocks", "3"]
    common = ["--data", url, "--seq-len", str(SEQ_LEN), "--batch-size", str(BATCH), *block]
    rng = np.random.default_rng(schedule_seed)
    checkpoint = tmp_path / "checkpoint.json"
    consumed, seen = 0, {}
    for number, (ranks, workers) in enumerate(TOPOLOGIES):
        cache = node_env(number)
        out = tmp_path / f"segment{number}"
        args = [*common, "--workers", str(workers), "--out", str(out), "--checkpoint", str(checkpoint)]
        # ranks > 0 read the saved state 2 s late: the job must keep rank 0 from saving over it first
        args += ["--resume", "--late-resume", "2"] if number else []
        last = number == len(TOPOLOGIES) - 1
        remaining_steps = (n - consumed) // (ranks * BATCH)
        step = 0 if last else int(rng.integers(1, max(2, remaining_steps // 2)))
        if last:
            code, output = finish_job(start_job("elastic_job.py", ranks, *args))
            assert code == 0, output[-4000:]
        else:
            process = start_job(
                "elastic_job.py", ranks, *args, "--checkpoint-step", str(step), "--hang-after-checkpoint"
            )
            wait_for_checkpoint(process, checkpoint, consumed + step * ranks * BATCH, out, ranks, step, "plain")
        for record in records(out):
            if not last and record["step"] >= step:
                continue  # after the save: lost with the crash
            for j, index in enumerate(record["ids"]):
                position = consumed + record["rank"] + ranks * (record["step"] * BATCH + j)
                assert position not in seen, f"position {position} consumed twice"
                seen[position] = index
            expected = sum(int(reference[i]["input_ids"].sum()) for i in record["ids"])
            assert record["sum"] == expected  # the bytes read from S3 are the local copy's
        assert list(cache.rglob("whole")), "each node filled its own cache"
        if not last:
            consumed = orjson.loads(checkpoint.read_bytes())["consumed"]
    order = ResumableDistributedSampler(n, 1, 0, seed=1234, pad=False, order="block", block_samples=8, window_blocks=3)
    assert sorted(seen) == list(range(n)), "a position was skipped"
    assert [seen[p] for p in range(n)] == list(order)  # the uninterrupted run's order


def write_buckets(root: Path, samples: dict[str, int]) -> None:
    for split, sizes in (("train", samples), ("val", dict.fromkeys(samples, 4))):
        for b, (name, count) in enumerate(sorted(sizes.items())):
            tokens = 1 + b * 20_000 + np.arange(count * (SEQ_LEN + 1), dtype=np.int64)
            tokens[49::50] = EOS
            with open_writer(root / split / name, dtype="uint16", eos_id=EOS, vocab_size=65_536) as writer:
                for start in range(0, len(tokens), 50):
                    writer.add(tokens[start : start + 50])


@pytest.mark.parametrize(
    ("schedule_seed", "order"),
    [(4, {}), (7, {"order": "block", "block_samples": 8, "window_blocks": 2})],
    ids=["feistel", "block"],
)
def test_curriculum_over_s3_exactly_once_across_nodes_and_topologies(seaweed, node_env, tmp_path, schedule_seed, order):
    local = tmp_path / "data"
    write_buckets(local, {"a": 70, "b": 50, "c": 90})
    url = upload_tree(seaweed, local)
    phases = [{"duration_tokens": 1600, "mix": {"a": 1, "b": 1}}, {"duration_tokens": 2400, "mix": {"b": 1, "c": 2}}]
    data = {"max_length": SEQ_LEN, "packing": False, "allow_bucket_exhaustion": True, "curriculum": phases, **order}
    config = tmp_path / "remote.yaml"
    config.write_text(yaml.safe_dump({"data": {"path": url, **data}}))
    (tmp_path / "local.yaml").write_text(yaml.safe_dump({"data": {"path": str(local), **data}}))
    reference = CurriculumDataset(tmp_path / "local.yaml", seed=1234)
    n = len(reference)
    _, expected_bucket, _ = reference.locate(np.arange(n))
    rng = np.random.default_rng(schedule_seed)
    checkpoint = tmp_path / "checkpoint.json"
    consumed, seen = 0, {}
    for number, (ranks, workers) in enumerate(TOPOLOGIES):
        cache = node_env(number)
        out = tmp_path / f"segment{number}"
        args = ["--config", str(config), "--out", str(out), "--run-dir", str(tmp_path / "run")]
        args += ["--checkpoint", str(checkpoint), "--batch-size", str(BATCH), "--workers", str(workers)]
        args += ["--resume"] if number else []
        last = number == len(TOPOLOGIES) - 1
        first_step = consumed // (ranks * BATCH)
        step = 0 if last else first_step + int(rng.integers(1, max(2, (n - consumed) // (ranks * BATCH) // 2)))
        if last:
            code, output = finish_job(start_job("curriculum_job.py", ranks, *args))
            assert code == 0, output[-4000:]
        else:
            process = start_job(
                "curriculum_job.py", ranks, *args, "--checkpoint-step", str(step), "--hang-after-checkpoint"
            )
            target = (step - first_step) * ranks * BATCH + consumed
            wait_for_checkpoint(process, checkpoint, target, out, ranks, step - 1, "sampler")
        for record in records(out):
            if not last and record["step"] >= step:
                continue
            for position, bucket, first in zip(record["positions"], record["buckets"], record["first"], strict=True):
                assert position not in seen, f"position {position} consumed twice"
                seen[position] = bucket
                assert first == reference[position]["input_ids"][:2].tolist()  # the local copy's tokens
        assert list(cache.rglob("whole")), "each node filled its own cache"
        if not last:
            saved = orjson.loads(checkpoint.read_bytes())
            consumed = saved["sampler"]["consumed"]
            assert saved["curriculum"]["data_objects"] and saved["sampler"]["data_objects"]
    assert sorted(seen) == list(range(n)), "a position was skipped"
    assert [seen[p] for p in range(n)] == expected_bucket.tolist()
