"""Eval-broadcast under torchrun (3 gloo ranks): the set arrives identical everywhere with a
world-size-free eval loss, and a build that fails on rank 0 is the same error on every rank,
within seconds, with no rank left waiting."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import orjson
from torchrun_helpers import finish_job, start_job, tokenloom_cli

from tokenloom.formats import open_writer

EOS = 0


def test_rank0_build_failure_reaches_every_rank_and_none_hangs(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    with open_writer(tmp_path / "val", dtype="uint16", vocab_size=5000, eos_id=EOS) as writer:
        for _ in range(120):
            writer.add(np.append(rng.integers(1, 5000, size=int(rng.integers(3, 90))), EOS))
    assert tokenloom_cli("validate", str(tmp_path / "val"), "--deep").exit_code == 0
    missing = tmp_path / "no-such-val"
    out = tmp_path / "out"
    out.mkdir()
    started = time.monotonic()
    code, output = finish_job(
        start_job("eval_job.py", 3, "--good", str(tmp_path / "val"), "--bad", str(missing), "--out", str(out)),
        timeout=150,
    )
    assert code != 0, output[-4000:]  # the ranks exit with the error
    assert time.monotonic() - started < 150
    results = [orjson.loads(p.read_bytes()) for p in sorted(out.glob("rank*.json"))]
    assert [r["rank"] for r in results] == [0, 1, 2], output[-4000:]

    # the good broadcast: same bytes, shares that cover every label once, one loss on every rank
    assert len({r["digest"] for r in results}) == 1
    assert sum(r["tokens"] for r in results) == results[0]["whole_tokens"] > 0
    assert len({r["loss"] for r in results}) == 1
    assert abs(results[0]["loss"] - results[0]["whole_loss"]) <= 1e-12 * results[0]["whole_loss"]

    # the failed build: EvalBuildError with rank 0's message on every rank, quickly
    for r in results:
        assert r["bad"]["type"] == "EvalBuildError", r
        assert "rank 0 failed to build the eval set" in r["bad"]["message"], r
        assert str(missing) in r["bad"]["message"] or "no-such-val" in r["bad"]["message"], r
        assert r["bad"]["seconds"] < 30, r
    assert "EvalBuildError" in output

    # the eval set's cache entry, prebuilt and verified by the command line
    cache = ["eval-cache", "--path", str(tmp_path / "val"), "--seq-len", "32", "--cache-dir", str(tmp_path / "cache")]
    result = tokenloom_cli(*cache)
    assert result.exit_code == 0, result.output
    (entry,) = (tmp_path / "cache").glob("eval-*")
    assert tokenloom_cli("validate", str(entry)).exit_code == 0
    result = tokenloom_cli(*cache)  # the second time it verifies the entry instead of building it
    assert result.exit_code == 0, result.output
