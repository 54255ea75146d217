"""`tokenloom demo`, the README's first command, passes and leaves what it promises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tokenloom.demo import run_demo


def test_demo_command_passes_its_resume_check(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "COLUMNS": "200"}
    result = subprocess.run(
        [sys.executable, "-m", "tokenloom.formats", "demo", "--workdir", str(tmp_path / "work"), "--steps", "30"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "passed: every sample consumed exactly once" in result.stdout
    png = tmp_path / "work" / "tokenloom-demo.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "tokenloom-demo.png" in result.stdout  # the summary prints where the plot is


def test_demo_without_workdir_cleans_up(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    (tmp_path / "cwd").mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "tokenloom.formats", "demo", "--steps", "10"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path / "cwd",
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert list((tmp_path / "tmp").iterdir()) == []  # the temporary workdir is gone
    assert [p.name for p in (tmp_path / "cwd").iterdir()] == ["tokenloom-demo.png"]  # the plot it printed stays


def test_run_demo_accounts_for_every_sample(tmp_path: Path) -> None:
    report = run_demo(tmp_path, steps=25, log=lambda _line: None, plot=False)
    assert report.consumed_once
    assert (report.duplicates, report.missing) == (0, 0)
    assert report.steps_before == 25
    assert report.steps_after > 0
    assert report.tokens > 100_000
    assert 0 <= report.packing_padding < 0.05
