"""`tokenloom tokenize` killed with SIGKILL at a random moment, rerun: byte-identical output."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from tokenloom.tokenize import build_stdlib_corpus

TIMEOUT = 300


def command(corpus: Path, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tokenloom.formats",
        "tokenize",
        "--input-dir",
        str(corpus),
        "--output-dir",
        str(out),
        "--seq-len",
        "512",
        "--overlap-size",
        "64",
        "--num-workers",
        "2",
        "--shard-size-tokens",
        "100000",
        "--no-progress",
    ]


def digests(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    info = build_stdlib_corpus(root / "src")
    lines = info.path.read_bytes().splitlines()
    for copy in range(4):  # a few MB in several files, so a kill lands mid-run
        records = [orjson.loads(line) for line in lines]
        text = b"\n".join(orjson.dumps({**r, "id": f"{copy}-{r['id']}"}) for r in records) + b"\n"
        (root / "in" / f"part{copy}").mkdir(parents=True)
        (root / "in" / f"part{copy}" / "docs.jsonl").write_bytes(text)
    return root / "in"


@pytest.mark.parametrize("run", [1, 2])
def test_kill_at_a_random_moment_then_rerun_is_byte_identical(corpus: Path, tmp_path: Path, run: int) -> None:
    seed = int(os.environ.get("TOKENLOOM_KILL_SEED", time.time_ns())) + run
    print(f"kill seed {seed} (set TOKENLOOM_KILL_SEED to replay)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    started = time.monotonic()
    subprocess.run(command(corpus, tmp_path / "reference"), check=True, timeout=TIMEOUT, env=env)
    full_seconds = time.monotonic() - started
    reference = digests(tmp_path / "reference")
    assert any(name.endswith(".bin") for name in reference)

    delay = random.Random(seed).uniform(0.2, 0.8) * full_seconds
    for attempt in range(4):  # a machine faster than the reference run may finish first: kill sooner
        out = tmp_path / f"killed{attempt}"
        process = subprocess.Popen(command(corpus, out), env=env, start_new_session=True)
        time.sleep(delay)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        if process.returncode == -signal.SIGKILL:
            break
        delay /= 2
    else:
        pytest.fail("every run finished before it could be killed")
    assert not (out / "manifest.json").exists() or digests(out) == reference

    subprocess.run(command(corpus, out), check=True, timeout=TIMEOUT, env=env)
    assert digests(out) == reference, f"kill seed {seed}, killed after {delay:.2f} s"
