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


class KillCase:
    """A corpus of ``n`` texts dealt into ``parts`` jsonl files, its uninterrupted run (``whole``, ``expected``),
    the killed run's output dir and the kill points' generator (seeded: named in failure messages)."""

    def __init__(self, tmp_path: Path, tokenizer: Path, make_texts: Callable[..., list[str]], seed: int) -> None:
        self.tmp_path, self.tokenizer, self.make_texts, self.seed = tmp_path, tokenizer, make_texts, seed
        self.rng = random.Random(seed)
        self.out = tmp_path / "killed"

    def start(self, jsonl_dir: Callable[..., Path], n: int, corpus_seed: int, parts: int, **options: Any) -> None:
        texts = self.make_texts(n, seed=corpus_seed, max_words=120)
        self.corpus = jsonl_dir({f"part-{i}.jsonl": [{"text": t} for t in texts[i::parts]] for i in range(parts)})
        self.whole, self.expected = _whole(self.tmp_path, self.tokenizer, self.corpus, **options)

    def args(self, **options: Any) -> list[str]:
        """The killed run's command arguments."""
        return [str(self.corpus), str(self.out), str(self.tokenizer), orjson.dumps(options).decode()]

    def staged(self, **options: Any) -> tuple[list[str], Path, int]:
        """A converting run's command arguments, its staging dir and the least number of units it plans."""
        units = sum(p.stat().st_size for p in self.corpus.iterdir()) // OPTIONS["unit_bytes"]
        return self.args(**options), staging_dir(self.out), units


@pytest.fixture
def kill_case(
    tmp_path: Path, tiny_tokenizer: Path, seed: int, jsonl_dir: Callable[..., Path], make_texts: Callable[..., Any]
) -> Callable[..., KillCase]:
    """``kill_case(n, corpus_seed, parts, **options)``: a :class:`KillCase` with its whole run done."""

    def make(n: int, corpus_seed: int, parts: int, **options: Any) -> KillCase:
        case = KillCase(tmp_path, tiny_tokenizer, make_texts, seed)
        case.start(jsonl_dir, n, corpus_seed, parts, **options)
        return case

    return make


def test_kill_9_at_random_points_then_rerun_is_byte_identical(
    kill_case: Callable[..., KillCase], output_digest: Callable[[Path], dict[str, object]]
) -> None:
    """Killed in a fast-engine session and in an hf-engine session, finished with auto: hf's bytes."""
    case = kill_case(3000, 5, 3, engine="hf", **OPTIONS)
    units, rng, out, seed = _committed(case.whole), case.rng, case.out, case.seed
    assert units >= 20
    first = _kill_after_units(case.args(**OPTIONS, engine="fast"), out, rng.randint(1, units // 3), rng)
    assert not (out / "manifest.json").exists()
    second = _kill_after_units(case.args(**OPTIONS, engine="hf"), out, rng.randint(first + 1, 2 * units // 3), rng)
    assert second > first, f"seed {seed}"
    _rerun(case.args(**OPTIONS, engine="auto"))
    assert output_digest(out) == output_digest(case.whole), f"seed {seed}: killed after {first} and {second} units"
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    assert manifest["num_tokens"] == case.expected.tokens
    assert manifest["metadata"]["tokenize"]["engine"]["name"] == "fast"  # the session that finished


def test_kill_9_of_a_megatron_run_then_rerun_is_byte_identical(
    kill_case: Callable[..., KillCase], tree_digest: Callable[[Path], dict[str, str]]
) -> None:
    """Killed twice while tokenizing into the staging dataset, once around conversion and publishing."""
    options = {**OPTIONS, "format": "megatron", "drop_overlap_prefix": True}
    case = kill_case(2000, 6, 2, **options)
    (args, staging, units), rng, out, seed = case.staged(**options), case.rng, case.out, case.seed
    first = _kill_after_units(args, staging, rng.randint(1, units // 3), rng)
    second = _kill_after_units(args, staging, rng.randint(first + 1, 2 * units // 3), rng)
    assert second > first and not (out / "data.idx").exists(), f"seed {seed}"
    _kill_around_publishing_then_rerun(args, staging, out, rng)
    assert tree_digest(out) == tree_digest(case.whole), f"seed {seed}: killed after {first} and {second} units"
    assert sorted(tree_digest(out)) == ["data.bin", "data.idx", "data.tokenloom.json", "tokenize.json"]


@pytest.mark.parametrize("fmt", ["flat", "packed"])
def test_kill_9_of_a_flat_or_packed_run_then_rerun_is_byte_identical(
    fmt: str, kill_case: Callable[..., KillCase], tree_digest: Callable[[Path], dict[str, str]]
) -> None:
    """The converting formats other than megatron: killed while staging and around conversion, then rerun."""
    options = {**OPTIONS, "format": fmt, "drop_overlap_prefix": True}
    case = kill_case(1500, 7, 2, **options)
    (args, staging, units), rng = case.staged(**options), case.rng
    first = _kill_after_units(args, staging, rng.randint(1, units // 2), rng)
    _kill_around_publishing_then_rerun(args, staging, case.out, rng)
    assert tree_digest(case.out) == tree_digest(case.whole), f"seed {case.seed}: killed after {first} units"


@pytest.mark.parametrize("again", ["resume", "overwrite"])
def test_kill_9_of_an_overwrite_over_an_old_layout_then_rerun_is_byte_identical(
    again: str, kill_case: Callable[..., KillCase], output_digest: Callable[[Path], dict[str, object]]
) -> None:
    """--overwrite over a dataset of the old shard layout, killed mid-run; rerun with or without --overwrite."""
    import shutil

    case = kill_case(1500, 8, 2, **OPTIONS)
    case.out = case.tmp_path / "old"
    shutil.copytree(Path(__file__).parent / "data" / "old_layout_native", case.out)
    first = _kill_after_units(case.args(**OPTIONS, overwrite=True), case.out, case.rng.randint(1, 4), case.rng)
    _rerun(case.args(**OPTIONS, overwrite=again == "overwrite"))
    assert output_digest(case.out) == output_digest(case.whole), f"seed {case.seed}: killed after {first} units"
    assert not list(case.out.glob("shard_*"))
