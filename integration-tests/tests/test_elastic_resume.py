"""Real ranks, a crash after a checkpoint, and a resume on another world size.

2 ranks (torchrun, gloo, CPU), each with 2 DataLoader workers, checkpoint the
data state at step k; the job is SIGKILLed while it keeps working; 3 ranks
resume from the checkpoint and finish the epoch. Every sample of the epoch is
consumed exactly once (what the crashed job did after its checkpoint is lost,
as in a real crash), in the same global order an uninterrupted job uses, and the
batches before the checkpoint equal an uninterrupted run's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson
import pytest

from tokenloom.formats import open_writer
from tokenloom.sampler import ResumableDistributedSampler

JOB = Path(__file__).parent / "jobs" / "elastic_job.py"
SEQ_LEN, BATCH, CHECKPOINT_STEP, EOS = 64, 4, 10, 0
TIMEOUT = 240


def make_tokens(root: Path) -> int:
    rng = np.random.default_rng(7)
    lengths = rng.integers(5, 120, size=260)
    with open_writer(root, dtype="uint16", vocab_size=1000, eos_id=EOS) as writer:
        for length in lengths:
            writer.add(np.append(rng.integers(1, 1000, size=int(length) - 1), EOS))
    return int(lengths.sum()) // (SEQ_LEN + 1)


def torchrun(nproc: int, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return subprocess.Popen(
        [*command, str(JOB), *args], env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def finish(process: subprocess.Popen[bytes]) -> None:
    try:
        output, _ = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"the job hung for {TIMEOUT} s")
    assert process.returncode == 0, output.decode(errors="replace")[-4000:]


def records(out: Path) -> list[dict]:
    found = []
    for path in sorted(out.glob("rank*.jsonl")):
        found += [orjson.loads(line) for line in path.read_bytes().splitlines()]
    return found


def test_crash_then_resume_on_three_ranks_consumes_every_sample_once(tmp_path: Path) -> None:
    data = tmp_path / "tokens"
    num_samples = make_tokens(data)
    common = ["--data", str(data), "--seq-len", str(SEQ_LEN), "--batch-size", str(BATCH)]

    # the reference: an uninterrupted job on 2 ranks
    finish(torchrun(2, *common, "--out", str(tmp_path / "full"), "--checkpoint", str(tmp_path / "unused.json")))

    # the crashed job: checkpoint at step k, keep working, SIGKILL
    checkpoint = tmp_path / "checkpoint.json"
    crashed = torchrun(
        2,
        *common,
        "--out",
        str(tmp_path / "crashed"),
        "--checkpoint",
        str(checkpoint),
        "--checkpoint-step",
        str(CHECKPOINT_STEP),
        "--hang-after-checkpoint",
    )
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        done = [r for r in records(tmp_path / "crashed") if r["step"] > CHECKPOINT_STEP]
        if checkpoint.exists() and len({r["rank"] for r in done}) == 2:
            break  # both ranks are past the checkpoint: kill mid-flight
        if crashed.poll() is not None:
            pytest.fail("the job ended before it could be killed: " + crashed.stdout.read().decode()[-4000:])
        time.sleep(0.2)
    else:
        os.killpg(crashed.pid, signal.SIGKILL)
        pytest.fail("no checkpoint before the timeout")
    os.killpg(crashed.pid, signal.SIGKILL)
    crashed.wait(timeout=30)
    assert crashed.returncode != 0

    state = orjson.loads(checkpoint.read_bytes())
    assert state["consumed"] == CHECKPOINT_STEP * BATCH * 2

    # resume on 3 ranks
    finish(torchrun(3, *common, "--out", str(tmp_path / "resumed"), "--checkpoint", str(checkpoint), "--resume"))

    full = records(tmp_path / "full")
    before = [r for r in records(tmp_path / "crashed") if r["step"] < CHECKPOINT_STEP]
    after = records(tmp_path / "resumed")
    assert {r["world"] for r in after} == {3}

    # the batches before the checkpoint equal the uninterrupted run's
    key = lambda r: (r["rank"], r["step"])  # noqa: E731
    reference = {key(r): r for r in full if r["step"] < CHECKPOINT_STEP}
    assert {key(r): r for r in before} == reference

    # every sample exactly once
    consumed = [i for r in before + after for i in r["ids"]]
    assert sorted(consumed) == list(range(num_samples))

    # and in the one global order, whatever the world size
    order = list(ResumableDistributedSampler(num_samples, num_replicas=1, rank=0, seed=1234, pad=False))
    position_of = {index: position for position, index in enumerate(order)}
    start = CHECKPOINT_STEP * BATCH * 2
    for r in after:
        for j, index in enumerate(r["ids"]):
            expected_position = start + r["rank"] + 3 * (r["step"] * BATCH + j)
            assert position_of[index] == expected_position
