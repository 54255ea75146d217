"""kill -9 at a random point, run the same command again: the output is byte-identical."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tokenloom.tokenize import TokenizeConfig, tokenize
from tokenloom.tokenize._state import read_state

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses SIGKILL and /proc")

SCRIPT = """
import sys
from tokenloom.tokenize import TokenizeConfig, tokenize
tokenize(TokenizeConfig(input_dir=sys.argv[1], output_dir=sys.argv[2], tokenizer=sys.argv[3], num_workers=2,
                        shard_size_tokens=4000, chunk_lines=40, max_length=64, overlap_size=16))
"""
OPTIONS: dict[str, Any] = {"shard_size_tokens": 4000, "chunk_lines": 40, "max_length": 64, "overlap_size": 16}


def _session_pids(session: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == session and fields[0] != "Z":  # fields[3]: session id
                pids.append(int(entry.name))
    return pids


def _start(args: list[str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, *args], env=env, start_new_session=True, stderr=subprocess.PIPE
    )


def _kill_after_shards(args: list[str], out: Path, shards: int, rng: random.Random) -> int:
    """Start a run, SIGKILL it once at least ``shards`` shards are journaled (plus a random delay)."""
    proc = _start(args)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = read_state(out) if out.is_dir() else None
        if state is not None and len(state.shards) >= shards:
            break
        if proc.poll() is not None:
            pytest.fail(f"the run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        time.sleep(0.005)
    time.sleep(rng.uniform(0, 0.05))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    # the workers notice their parent is gone and exit on their own
    deadline = time.monotonic() + 10
    while _session_pids(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _session_pids(proc.pid) == []
    state = read_state(out)
    assert state is not None
    return len(state.shards)


def test_kill_9_at_random_points_then_rerun_is_byte_identical(
    tmp_path: Path,
    tiny_tokenizer: Path,
    jsonl_dir: Callable[..., Path],
    make_texts: Callable[..., list[str]],
    tree_digest: Callable[[Path], dict[str, str]],
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    texts = make_texts(3000, seed=5, max_words=120)
    corpus = jsonl_dir({f"part-{i}.jsonl": [{"text": t} for t in texts[i::3]] for i in range(3)})
    whole = tmp_path / "whole"
    expected = tokenize(
        TokenizeConfig(input_dir=corpus, output_dir=whole, tokenizer=str(tiny_tokenizer), num_workers=0, **OPTIONS)
    )
    assert expected.shards >= 20
    out = tmp_path / "killed"
    args = [str(corpus), str(out), str(tiny_tokenizer)]
    first = _kill_after_shards(args, out, rng.randint(1, expected.shards // 3), rng)
    assert not (out / "manifest.json").exists()
    second = _kill_after_shards(args, out, rng.randint(first + 1, 2 * expected.shards // 3), rng)
    assert second > first, f"seed {seed}"
    final = _start(args)
    _, stderr = final.communicate(timeout=120)
    assert final.returncode == 0, stderr.decode()[-2000:]
    assert tree_digest(out) == tree_digest(whole), f"seed {seed}: killed after {first} and {second} shards"
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    assert manifest["num_tokens"] == expected.tokens
