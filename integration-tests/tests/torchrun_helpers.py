"""Helpers shared by the torchrun tests: launch a job, wait with a deadline, run the CLI in-process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

JOBS = Path(__file__).parent / "jobs"
JOB_TIMEOUT = 180  # seconds any one torchrun job may take before the test fails (a hang fails)


def start_job(job: str, nproc: int, *args: str) -> subprocess.Popen[bytes]:
    """``torchrun --standalone --nproc-per-node=N jobs/<job> ARGS`` in its own session (so it can be killed whole)."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return subprocess.Popen(
        [*command, str(JOBS / job), *args],
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def finish_job(process: subprocess.Popen[bytes], *, timeout: float = JOB_TIMEOUT) -> tuple[int, str]:
    """Wait for the job; kill its whole process group and fail the test if it outlives ``timeout``."""
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=30)
        pytest.fail(f"the job hung for {timeout} s")
    return process.returncode, output.decode(errors="replace")


def kill_job(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate(timeout=30)


def tokenloom_cli(*args: str) -> Result:
    """The ``tokenloom`` console script's click group, run in this process (no interpreter start per call)."""
    (script,) = [ep for ep in entry_points(group="console_scripts") if ep.name == "tokenloom"]
    return CliRunner().invoke(script.load(), list(args), catch_exceptions=False)
