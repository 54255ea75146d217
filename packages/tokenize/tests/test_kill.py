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

from tokenloom.tokenize import TokenizeConfig, staging_dir, tokenize

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses SIGKILL and /proc")

SCRIPT = """
import json, sys
from tokenloom.tokenize import TokenizeConfig, tokenize
tokenize(TokenizeConfig(input_dir=sys.argv[1], output_dir=sys.argv[2], tokenizer=sys.argv[3], num_workers=2,
                        **json.loads(sys.argv[4])))
"""
OPTIONS: dict[str, Any] = {
    "shard_size_tokens": 4000,
    "chunk_lines": 40,
    "seq_len": 64,
    "overlap_size": 16,
    "unit_bytes": 20_000,  # many units: a kill costs at most the units in flight
}


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


def _kill_when(args: list[str], ready: Callable[[], bool], rng: random.Random, *, may_finish: bool = False) -> None:
    """Start a run and SIGKILL it once ``ready()`` (plus a random delay of up to 50 ms)."""
    proc = _start(args)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not ready():
        if proc.poll() is not None:
            pytest.fail(f"the run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        time.sleep(0.005)
    time.sleep(rng.uniform(0, 0.05))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL or (may_finish and proc.returncode == 0)
    # the workers notice their parent is gone and exit on their own
    deadline = time.monotonic() + 10
    while _session_pids(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _session_pids(proc.pid) == []


def _committed(out: Path) -> int:
    return len(list(out.glob(".tokenloom-unit-*.done"))) if out.is_dir() else 0


def _kill_after_units(args: list[str], out: Path, units: int, rng: random.Random) -> int:
    """Start a run, SIGKILL it once at least ``units`` units are committed (plus a random delay)."""
    _kill_when(args, lambda: _committed(out) >= units, rng)
    assert (out / ".tokenloom-plan.json").is_file()
    return _committed(out)


def test_kill_9_at_random_points_then_rerun_is_byte_identical(
    tmp_path: Path,
    tiny_tokenizer: Path,
    jsonl_dir: Callable[..., Path],
    make_texts: Callable[..., list[str]],
    output_digest: Callable[[Path], dict[str, object]],
) -> None:
    """Killed in a fast-engine session and in an hf-engine session, finished with auto: hf's bytes."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    texts = make_texts(3000, seed=5, max_words=120)
    corpus = jsonl_dir({f"part-{i}.jsonl": [{"text": t} for t in texts[i::3]] for i in range(3)})
    whole = tmp_path / "whole"
    expected = tokenize(
        TokenizeConfig(
            input_dir=corpus, output_dir=whole, tokenizer=str(tiny_tokenizer), num_workers=0, engine="hf", **OPTIONS
        )
    )
    units = _committed(whole)
    assert units >= 20
    out = tmp_path / "killed"

    def args(engine: str) -> list[str]:
        return [str(corpus), str(out), str(tiny_tokenizer), orjson.dumps({**OPTIONS, "engine": engine}).decode()]

    first = _kill_after_units(args("fast"), out, rng.randint(1, units // 3), rng)
    assert not (out / "manifest.json").exists()
    second = _kill_after_units(args("hf"), out, rng.randint(first + 1, 2 * units // 3), rng)
    assert second > first, f"seed {seed}"
    final = _start(args("auto"))
    _, stderr = final.communicate(timeout=120)
    assert final.returncode == 0, stderr.decode()[-2000:]
    assert output_digest(out) == output_digest(whole), f"seed {seed}: killed after {first} and {second} units"
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    assert manifest["num_tokens"] == expected.tokens
    assert manifest["metadata"]["tokenize"]["engine"]["name"] == "fast"  # the session that finished


def test_kill_9_of_a_megatron_run_then_rerun_is_byte_identical(
    tmp_path: Path,
    tiny_tokenizer: Path,
    jsonl_dir: Callable[..., Path],
    make_texts: Callable[..., list[str]],
    tree_digest: Callable[[Path], dict[str, str]],
) -> None:
    """Killed twice while tokenizing into the staging dataset, once around conversion and publishing."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    texts = make_texts(2000, seed=6, max_words=120)
    corpus = jsonl_dir({f"part-{i}.jsonl": [{"text": t} for t in texts[i::2]] for i in range(2)})
    options = {**OPTIONS, "format": "megatron", "drop_overlap_prefix": True}
    whole = tmp_path / "whole"
    tokenize(
        TokenizeConfig(input_dir=corpus, output_dir=whole, tokenizer=str(tiny_tokenizer), num_workers=0, **options)
    )
    out = tmp_path / "killed"
    staging = staging_dir(out)
    args = [str(corpus), str(out), str(tiny_tokenizer), orjson.dumps(options).decode()]
    units = sum(p.stat().st_size for p in corpus.iterdir()) // OPTIONS["unit_bytes"]  # at least this many
    first = _kill_after_units(args, staging, rng.randint(1, units // 3), rng)
    second = _kill_after_units(args, staging, rng.randint(first + 1, 2 * units // 3), rng)
    assert second > first and not (out / "data.idx").exists(), f"seed {seed}"
    _kill_when(args, lambda: (staging / "manifest.json").exists() or out.exists(), rng, may_finish=True)
    final = _start(args)
    _, stderr = final.communicate(timeout=120)
    assert final.returncode == 0, stderr.decode()[-2000:]
    assert tree_digest(out) == tree_digest(whole), f"seed {seed}: killed after {first} and {second} units"
    assert sorted(tree_digest(out)) == ["data.bin", "data.idx", "data.tokenloom.json", "tokenize.json"]
    assert not staging.exists()


@pytest.mark.parametrize("fmt", ["flat", "packed"])
def test_kill_9_of_a_flat_or_packed_run_then_rerun_is_byte_identical(
    fmt: str,
    tmp_path: Path,
    tiny_tokenizer: Path,
    jsonl_dir: Callable[..., Path],
    make_texts: Callable[..., list[str]],
    tree_digest: Callable[[Path], dict[str, str]],
) -> None:
    """The converting formats other than megatron: killed while staging and around conversion, then rerun."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    texts = make_texts(1500, seed=7, max_words=120)
    corpus = jsonl_dir({f"part-{i}.jsonl": [{"text": t} for t in texts[i::2]] for i in range(2)})
    options = {**OPTIONS, "format": fmt, "drop_overlap_prefix": True}
    whole = tmp_path / "whole"
    tokenize(
        TokenizeConfig(input_dir=corpus, output_dir=whole, tokenizer=str(tiny_tokenizer), num_workers=0, **options)
    )
    out = tmp_path / "killed"
    staging = staging_dir(out)
    args = [str(corpus), str(out), str(tiny_tokenizer), orjson.dumps(options).decode()]
    units = sum(p.stat().st_size for p in corpus.iterdir()) // OPTIONS["unit_bytes"]
    first = _kill_after_units(args, staging, rng.randint(1, units // 2), rng)
    _kill_when(args, lambda: (staging / "manifest.json").exists() or out.exists(), rng, may_finish=True)
    final = _start(args)
    _, stderr = final.communicate(timeout=120)
    assert final.returncode == 0, stderr.decode()[-2000:]
    assert tree_digest(out) == tree_digest(whole), f"seed {seed}: killed after {first} units"
    assert not staging.exists()


@pytest.mark.parametrize("again", ["resume", "overwrite"])
def test_kill_9_of_an_overwrite_over_an_old_layout_then_rerun_is_byte_identical(
    again: str,
    tmp_path: Path,
    tiny_tokenizer: Path,
    jsonl_dir: Callable[..., Path],
    make_texts: Callable[..., list[str]],
    output_digest: Callable[[Path], dict[str, object]],
) -> None:
    """--overwrite over a dataset of the old shard layout, killed mid-run; rerun with or without --overwrite."""
    import shutil

    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    texts = make_texts(1500, seed=8, max_words=120)
    corpus = jsonl_dir({f"part-{i}.jsonl": [{"text": t} for t in texts[i::2]] for i in range(2)})
    whole = tmp_path / "whole"
    tokenize(
        TokenizeConfig(input_dir=corpus, output_dir=whole, tokenizer=str(tiny_tokenizer), num_workers=0, **OPTIONS)
    )
    out = tmp_path / "old"
    shutil.copytree(Path(__file__).parent / "data" / "old_layout_native", out)

    def args(overwrite: bool) -> list[str]:
        return [str(corpus), str(out), str(tiny_tokenizer), orjson.dumps({**OPTIONS, "overwrite": overwrite}).decode()]

    first = _kill_after_units(args(True), out, rng.randint(1, 4), rng)
    final = _start(args(again == "overwrite"))
    _, stderr = final.communicate(timeout=120)
    assert final.returncode == 0, stderr.decode()[-2000:]
    assert output_digest(out) == output_digest(whole), f"seed {seed}: killed after {first} units"
    assert not list(out.glob("shard_*"))
