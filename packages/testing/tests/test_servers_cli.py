"""`python -m tokenloom.testing.servers s3`: a local S3 server for a shell (the README recipe)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tokenloom.formats import open_dataset, open_writer
from tokenloom.testing.servers import weed_binary

pytestmark = pytest.mark.skipif(weed_binary() is None, reason="the seaweedfs binary `weed` is not installed")

CLI = [sys.executable, "-m", "tokenloom.testing.servers"]


def _exports(text: str) -> dict[str, str]:
    found = {}
    for line in text.splitlines():
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            found[name] = shlex.split(value)[0]
    return found


def test_the_server_outlives_the_command_and_the_exports_reach_it(tmp_path):
    local = tmp_path / "tokens" / "train" / "code"
    with open_writer(local, dtype="uint16", eos_id=0, vocab_size=1000) as writer:
        for n in range(1, 50):
            writer.add([*range(1, n + 1), 0])
    done = subprocess.run(
        [*CLI, "s3", str(tmp_path / "server"), "--upload", f"{tmp_path / 'tokens'}=data/tokens"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    env = _exports(done.stdout)
    assert set(env) >= {"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"}
    assert env["AWS_ALLOW_HTTP"] == "true" and env["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
    pid = int(env["TOKENLOOM_S3_PID"])
    try:
        # a new process that knows only the environment variables reads the uploaded tree as a dataset
        code = (
            "from tokenloom.formats import RemoteOptions, open_dataset; import sys; "
            "ds = open_dataset(sys.argv[1], remote=RemoteOptions(block_cache_dir=sys.argv[2])); "
            "print(len(ds), int(ds[48].sum()))"
        )
        url = f"s3://{env['TOKENLOOM_S3_BUCKET']}/data/tokens/train/code"
        read = subprocess.run(
            [sys.executable, "-c", code, url, str(tmp_path / "cache")],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        expected = open_dataset(local)
        assert read.returncode == 0, read.stderr
        assert read.stdout.split() == [str(len(expected)), str(int(expected[48].sum()))]
    finally:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def test_bad_arguments_are_refused_before_a_server_starts(tmp_path):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "file").write_text("x")
    cases = [
        ([str(tmp_path / "used")], "is not empty"),
        ([str(tmp_path / "new"), "--upload", "nothing-here=raw"], "expected LOCAL=PREFIX"),
        ([str(tmp_path / "new"), "--upload", str(tmp_path)], "expected LOCAL=PREFIX"),
    ]
    for args, message in cases:
        done = subprocess.run([*CLI, "s3", *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)
        assert done.stdout == ""
    assert not (tmp_path / "new").exists()


def test_a_relative_directory_holds_the_servers_data_itself(tmp_path):
    """``s3 s3-server`` (relative, as in the README recipe) keeps the data in s3-server/data. Before, the server
    ran with its directory as working directory and the relative -dir again: s3-server/s3-server/data."""
    done = subprocess.run([*CLI, "s3", "s3-server"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    pid = int(_exports(done.stdout)["TOKENLOOM_S3_PID"])
    try:
        assert sorted(p.name for p in (tmp_path / "s3-server").iterdir()) == ["data", "weed.log"]
        assert any((tmp_path / "s3-server" / "data").iterdir())
    finally:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
