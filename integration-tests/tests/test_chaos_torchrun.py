"""Chaos: torchrun ranks read a native dataset and an SFT record store from S3 through a faulty network.

SeaweedFS behind the fault proxy, which answers the jobs' GETs with random connection resets, 503 bursts and
flipped body bytes (flips only on the native dataset's objects; flips on a record store's blocks are tested in
packages/formats/tests/test_remote_records.py), and takes the store down for 60 s from the restarted job's first
request (however long its start takes: its first reads wait out the whole outage). ``jobs/chaos_job.py`` under real
``torch.distributed.run`` (gloo): 2 ranks x 2 DataLoader workers save the loader state at a step and work on; one
rank is SIGKILLed mid-epoch, torchrun stops the job; the same command on 3 ranks x 2 workers finds the checkpoint
and runs to the epoch's end. The oracle: each rank logs every sample it consumed (dataset, index; the store records
packed into an SFT sample; a digest of its bytes). Over both jobs, what was consumed up to the checkpoint and after
the restart is every sample exactly once, at the position an uninterrupted local run puts it, with that run's
bytes; every SFT record exactly once. Each flip was seen by the block verification and fetched again, and the
outage was waited out with a logged wait, within the retry budget.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import numpy as np
import orjson
import pytest
from torchrun_helpers import JOBS, finish_job, start_job, tokenloom_cli

from tokenloom.formats import open_writer
from tokenloom.sampler import ResumableDistributedSampler
from tokenloom.tokenize.chat import default_chat_template

sys.path.insert(0, str(JOBS))
from chaos_job import SEED, ChaosDataset  # the job's own dataset, for the local run

SEQ_LEN, BATCH, STEP = 128, 8, 6  # STEP: the step after which the first job saves its state
OUTAGE = 60.0  # seconds the store is down
#: per GET: resets, 503 bursts (3 in a row), flips (at most 2: a block is fetched 3 times before a ChecksumError)
RATES = {"reset": 0.05, "503": 0.04, "flip": 0.5}
#: a verification failure, naming the object: ``s3://bucket/key: block 3 arrived with a wrong hash`` (a block, an
#: index or a manifest: each copy is checked before it is published to the node cache, so a flip is met by the one
#: process that fetched it, once)
VERIFIED = re.compile(r"s3://[^/\s]+/(\S+?): (?:the object|block \d+) arrived with a wrong hash")
WAIT = re.compile(r"^(\d+\.\d+) rank\d+ pid\d+ tokenloom\.formats\.remote: waiting for ", re.MULTILINE)


def write_native(root: Path) -> None:
    rng = np.random.default_rng(5)
    with open_writer(root, dtype="uint16", vocab_size=1000, eos_id=0, shard_size_tokens=20_000) as writer:
        for _ in range(900):
            writer.add(np.append(rng.integers(1, 1000, size=int(rng.integers(5, 200))), 0))


def write_sft(tmp_path: Path) -> Path:
    """A small conversation corpus -> ``tokenloom tokenize --train-type sft`` (the shipped chat template)."""
    chat, store = tmp_path / "chat", tmp_path / "sft"
    chat.mkdir()
    rows = []
    for i in range(300):
        answer = f"Function {i} of module m{i % 13} returns {i * 7}. " * (1 + i % 4)
        messages = [{"role": "user", "content": f"What does m{i % 13}.f{i} do?"}]
        messages.append({"role": "assistant", "content": answer})
        if i % 5 == 0:
            messages = [{"role": "system", "content": "Answer briefly."}, *messages]
        rows.append({"messages": messages})
    (chat / "part-0.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    args = ["tokenize", "--input-dir", str(chat), "--output-dir", str(store), "--train-type", "sft"]
    args += ["--chat-template", str(default_chat_template()), "--seq-len", str(SEQ_LEN), "--no-progress"]
    result = tokenloom_cli(*args)
    assert result.exit_code == 0, result.output
    return store


def records(out: Path) -> list[dict]:
    return [orjson.loads(line) for path in sorted(out.glob("rank*.jsonl")) for line in path.read_bytes().splitlines()]


def wait_for(condition, process, what: str, timeout: float = 150.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            pytest.fail(f"the job ended before {what}: " + process.stdout.read().decode(errors="replace")[-4000:])
        if time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            pytest.fail(f"no {what} within {timeout} s")
        time.sleep(0.2)


@pytest.mark.slow
def test_chaos_two_ranks_killed_mid_epoch_resume_on_three_exactly_once(seaweed, fault_proxy, monkeypatch, tmp_path):
    native, sft = tmp_path / "native", write_sft(tmp_path)
    write_native(native)
    prefix = f"chaos-{uuid.uuid4().hex[:8]}"
    seaweed.upload_tree(native, f"{prefix}/native")
    seaweed.upload_tree(sft, f"{prefix}/sft")
    for name, value in {
        **seaweed.env, "AWS_ENDPOINT_URL": fault_proxy.url, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1",
        "TOKENLOOM_CACHE_DIR": str(tmp_path / "node-cache"),  # one node: the restart finds the killed job's cache
        "TOKENLOOM_RETRY_BUDGET": str(2.5 * OUTAGE),  # the outage, with room to spare on a busy machine
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    checkpoint, out0, out1 = tmp_path / "checkpoint.json", tmp_path / "job0", tmp_path / "job1"
    common = ["--native", f"s3://{seaweed.bucket}/{prefix}/native", "--sft", f"s3://{seaweed.bucket}/{prefix}/sft"]
    common += ["--checkpoint", str(checkpoint), "--seq-len", str(SEQ_LEN), "--batch-size", str(BATCH)]
    fault_proxy.faults = ["reset", "503", "503", "503"]  # the first GETs for sure, then at random
    fault_proxy.random_faults(RATES, seed=11, paths={"flip": f"/{prefix}/native/"}, burst=3, limits={"flip": 2})

    first = start_job("chaos_job.py", 2, *common, "--out", str(out0), "--workers", "2",
                      "--checkpoint-step", str(STEP), "--hang-after-checkpoint")  # fmt: skip

    def saved_and_past() -> bool:
        done = {r["rank"] for r in records(out0) if r["step"] > STEP}
        return checkpoint.exists() and done == {0, 1}

    wait_for(saved_and_past, first, "checkpoint followed by a step on every rank")
    os.kill(int((out0 / "rank1.pid").read_text()), signal.SIGKILL)  # one rank dies mid-epoch
    code, output0 = finish_job(first)
    assert code != 0, output0[-4000:]  # torchrun saw the rank die and stopped the job
    # the store goes down at the restart's first request, however long its start (torchrun, imports, process
    # group) takes on a busy machine: the restarted ranks meet the whole outage and must wait it out
    fault_proxy.down_for(OUTAGE, "reset", armed=True)

    code, output1 = finish_job(start_job("chaos_job.py", 3, *common, "--out", str(out1), "--workers", "2"))
    assert code == 0, output1[-4000:]
    output = output0 + output1

    reference = ChaosDataset(native, sft, SEQ_LEN)  # the uninterrupted local run: one process, the local files
    n = len(reference)
    order = list(ResumableDistributedSampler(n, 1, 0, seed=SEED, pad=False))
    consumed = orjson.loads(checkpoint.read_bytes())["sampler"]["consumed"]
    assert consumed == STEP * 2 * BATCH
    seen: dict[int, tuple[list[int], list[int], int]] = {}
    for out, ranks, start, last_step in ((out0, 2, 0, STEP), (out1, 3, consumed, None)):
        for line in records(out):
            if last_step is not None and line["step"] >= last_step:
                continue  # after the save: lost with the killed job
            for j, sample in enumerate(zip(line["identity"], line["records"], line["digest"], strict=True)):
                position = start + line["rank"] + ranks * (line["step"] * BATCH + j)
                assert position not in seen, f"position {position} consumed twice"
                seen[position] = sample
    assert sorted(seen) == list(range(n)), f"{n - len(seen)} samples never consumed"
    for position, index in enumerate(order):
        identity, packed, got = seen[position]
        source, local, expected_records = reference.identity(index)
        assert identity == [source, local], f"position {position}"
        assert [r for r in packed if r >= 0] == expected_records
        assert got == int(reference[index]["digest"]), f"sample {identity} differs from the local copy's bytes"
    sft_records = Counter(r for _, packed, _ in seen.values() for r in packed if r >= 0)
    fitting = len(reference.sft.store) - reference.sft.num_too_long
    assert len(sft_records) == fitting > 0 and set(sft_records.values()) == {1}  # each SFT record exactly once

    injected = fault_proxy.injected
    assert injected["reset"] >= 1 and injected["503"] >= 3 and injected["down"] >= 1, injected
    # every flipped answer was caught by the verification and fetched again; nothing else was reported corrupt
    flipped = Counter(path.split("/", 2)[2] for path in fault_proxy.flipped.elements())  # /bucket/key -> key
    caught = Counter(VERIFIED.findall(output))
    assert injected["flip"] >= 1 and flipped.total() == injected["flip"], (injected, fault_proxy.flipped)
    assert caught == flipped, (flipped, caught, output[-4000:])
    waits = [float(t) for t in WAIT.findall(output)]
    began = fault_proxy.down_began
    assert began and any(began <= t <= began + OUTAGE for t in waits), (began, waits, output[-4000:])
