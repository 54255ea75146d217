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
from tokenize_helpers import session_pids

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
    while session_pids(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert session_pids(proc.pid) == []


def _committed(out: Path) -> int:
    return len(list(out.glob(".tokenloom-unit-*.done"))) if out.is_dir() else 0


def _kill_after_units(args: list[str], out: Path, units: int, rng: random.Random) -> int:
    """Start a run, SIGKILL it once at least ``units`` units are committed (plus a random delay)."""
    _kill_when(args, lambda: _committed(out) >= units, rng)
    assert (out / ".tokenloom-plan.json").is_file()
    return _committed(out)


def _rerun(args: list[str]) -> None:
    """Run the command again to its end: it must succeed."""
    final = _start(args)
    _, stderr = final.communicate(timeout=120)
    assert final.returncode == 0, stderr.decode()[-2000:]


def _whole(tmp_path: Path, tiny_tokenizer: Path, corpus: Path, **options: Any) -> tuple[Path, Any]:
    """The reference: the corpus tokenized in one uninterrupted in-process run into tmp_path/whole."""
    whole = tmp_path / "whole"
    summary = tokenize(
        TokenizeConfig(input_dir=corpus, output_dir=whole, tokenizer=str(tiny_tokenizer), num_workers=0, **options)
    )
    return whole, summary


def _kill_around_publishing_then_rerun(args: list[str], staging: Path, out: Path, rng: random.Random) -> None:
    """Kill a converting run once its staging dataset is complete (it may finish first), then run it to its end."""
    _kill_when(args, lambda: (staging / "manifest.json").exists() or out.exists(), rng, may_finish=True)
    _rerun(args)
    assert not staging.exists()


@pytest.fixture
def seed() -> int:
    """A fresh seed for the kill points, named in the failure messages to replay a run."""
    return random.randrange(1 << 30)


@pytest.fixture
def split_corpus(jsonl_dir: Callable[..., Path], make_texts: Callable[..., list[str]]) -> Callable[..., Path]:
    """``make_texts(n, seed=seed, max_words=120)`` dealt round-robin into ``parts`` jsonl files."""

    def make(n: int, seed: int, parts: int) -> Path:
        texts = make_texts(n, seed=seed, max_words=120)
        return jsonl_dir({f"part-{i}.jsonl": [{"text": t} for t in texts[i::parts]] for i in range(parts)})

    return make


def _staged(corpus: Path, out: Path, tiny_tokenizer: Path, options: dict[str, Any]) -> tuple[list[str], Path, int]:
    """A converting run's command arguments, its staging dir and the least number of units it plans."""
    args = [str(corpus), str(out), str(tiny_tokenizer), orjson.dumps(options).decode()]
    return args, staging_dir(out), sum(p.stat().st_size for p in corpus.iterdir()) // OPTIONS["unit_bytes"]


def test_kill_9_at_random_points_then_rerun_is_byte_identical(
    tmp_path: Path,
    tiny_tokenizer: Path,
    seed: int,
    split_corpus: Callable[..., Path],
    output_digest: Callable[[Path], dict[str, object]],
) -> None:
    """Killed in a fast-engine session and in an hf-engine session, finished with auto: hf's bytes."""
    rng = random.Random(seed)
    corpus = split_corpus(3000, 5, 3)
    whole, expected = _whole(tmp_path, tiny_tokenizer, corpus, engine="hf", **OPTIONS)
    units = _committed(whole)
    assert units >= 20
    out = tmp_path / "killed"

    def args(engine: str) -> list[str]:
        return [str(corpus), str(out), str(tiny_tokenizer), orjson.dumps({**OPTIONS, "engine": engine}).decode()]

    first = _kill_after_units(args("fast"), out, rng.randint(1, units // 3), rng)
    assert not (out / "manifest.json").exists()
    second = _kill_after_units(args("hf"), out, rng.randint(first + 1, 2 * units // 3), rng)
    assert second > first, f"seed {seed}"
    _rerun(args("auto"))
    assert output_digest(out) == output_digest(whole), f"seed {seed}: killed after {first} and {second} units"
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    assert manifest["num_tokens"] == expected.tokens
    assert manifest["metadata"]["tokenize"]["engine"]["name"] == "fast"  # the session that finished


def test_kill_9_of_a_megatron_run_then_rerun_is_byte_identical(
    tmp_path: Path,
    tiny_tokenizer: Path,
    seed: int,
    split_corpus: Callable[..., Path],
    tree_digest: Callable[[Path], dict[str, str]],
) -> None:
    """Killed twice while tokenizing into the staging dataset, once around conversion and publishing."""
    rng = random.Random(seed)
    corpus = split_corpus(2000, 6, 2)
    options = {**OPTIONS, "format": "megatron", "drop_overlap_prefix": True}
    whole, _ = _whole(tmp_path, tiny_tokenizer, corpus, **options)
    out = tmp_path / "killed"
    args, staging, units = _staged(corpus, out, tiny_tokenizer, options)
    first = _kill_after_units(args, staging, rng.randint(1, units // 3), rng)
    second = _kill_after_units(args, staging, rng.randint(first + 1, 2 * units // 3), rng)
    assert second > first and not (out / "data.idx").exists(), f"seed {seed}"
    _kill_around_publishing_then_rerun(args, staging, out, rng)
    assert tree_digest(out) == tree_digest(whole), f"seed {seed}: killed after {first} and {second} units"
    assert sorted(tree_digest(out)) == ["data.bin", "data.idx", "data.tokenloom.json", "tokenize.json"]


@pytest.mark.parametrize("fmt", ["flat", "packed"])
def test_kill_9_of_a_flat_or_packed_run_then_rerun_is_byte_identical(
    fmt: str,
    tmp_path: Path,
    tiny_tokenizer: Path,
    seed: int,
    split_corpus: Callable[..., Path],
    tree_digest: Callable[[Path], dict[str, str]],
) -> None:
    """The converting formats other than megatron: killed while staging and around conversion, then rerun."""
    rng = random.Random(seed)
    corpus = split_corpus(1500, 7, 2)
    options = {**OPTIONS, "format": fmt, "drop_overlap_prefix": True}
    whole, _ = _whole(tmp_path, tiny_tokenizer, corpus, **options)
    out = tmp_path / "killed"
    args, staging, units = _staged(corpus, out, tiny_tokenizer, options)
    first = _kill_after_units(args, staging, rng.randint(1, units // 2), rng)
    _kill_around_publishing_then_rerun(args, staging, out, rng)
    assert tree_digest(out) == tree_digest(whole), f"seed {seed}: killed after {first} units"


@pytest.mark.parametrize("again", ["resume", "overwrite"])
def test_kill_9_of_an_overwrite_over_an_old_layout_then_rerun_is_byte_identical(
    again: str,
    tmp_path: Path,
    tiny_tokenizer: Path,
    seed: int,
    split_corpus: Callable[..., Path],
    output_digest: Callable[[Path], dict[str, object]],
) -> None:
    """--overwrite over a dataset of the old shard layout, killed mid-run; rerun with or without --overwrite."""
    import shutil

    rng = random.Random(seed)
    corpus = split_corpus(1500, 8, 2)
    whole, _ = _whole(tmp_path, tiny_tokenizer, corpus, **OPTIONS)
    out = tmp_path / "old"
    shutil.copytree(Path(__file__).parent / "data" / "old_layout_native", out)

    def args(overwrite: bool) -> list[str]:
        return [str(corpus), str(out), str(tiny_tokenizer), orjson.dumps({**OPTIONS, "overwrite": overwrite}).decode()]

    first = _kill_after_units(args(True), out, rng.randint(1, 4), rng)
    _rerun(args(again == "overwrite"))
    assert output_digest(out) == output_digest(whole), f"seed {seed}: killed after {first} units"
    assert not list(out.glob("shard_*"))
