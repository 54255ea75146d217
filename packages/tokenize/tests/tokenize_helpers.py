"""Helpers the tokenize test modules share (imported by name: conftest.py puts this folder on sys.path)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest


def session_pids(session: int) -> list[int]:
    """The live (not zombie) processes of a session."""
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


def wait_group_gone(group: int, timeout: float = 10.0, poll: float = 0.02) -> bool:
    """Wait until no process of the group is left; False if one still is after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        time.sleep(poll)
    return False


def kill_script_when(script: str, kwargs: dict[str, Any], ready: Callable[[], bool], timeout: float) -> int:
    """Run ``script`` with the JSON of ``kwargs`` in its own session, SIGKILL its whole group once ``ready()``.

    Returns the group id (the script's pid); fails the test if the script ends first or never gets ready.
    """
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", script, orjson.dumps(kwargs).decode()],
        env=env,
        start_new_session=True,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"the run ended before it was killed: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the run never reached the kill point"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # the run, its workers and its object-store helper
    proc.wait(timeout=10)
    return proc.pid


def s3_cli_env(seaweed: Any, cache: Path) -> dict[str, str]:
    """The environment of a ``tokenloom`` CLI subprocess that writes to the S3 server, offline."""
    return {**os.environ, **seaweed.shell_env(), "TOKENLOOM_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1"}
