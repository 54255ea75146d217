"""Defects a review of the object-storage wave found, each pinned by a test (real SeaweedFS S3 server, no mocks)."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tokenloom.formats import RemoteOptions, open_dataset, open_writer


def _write_native(root: Path) -> Path:
    rng = np.random.default_rng(0)
    with open_writer(root, format="native", dtype="uint16", vocab_size=1000, eos_id=0, shard_size_tokens=2000) as w:
        for _ in range(40):
            w.add(np.append(rng.integers(1, 1000, size=int(rng.integers(5, 200)), dtype=np.uint16), np.uint16(0)))
    return root


@pytest.fixture
def s3_env(seaweed, monkeypatch, tmp_path):
    for name, value in {**seaweed.shell_env(), "TOKENLOOM_CACHE_DIR": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(name, value)
    return seaweed


def test_cli_convert_to_s3_names_the_target_url_not_a_folded_path(s3_env, tmp_path):
    from tokenloom.formats.cli.group import main

    local = _write_native(tmp_path / "local")
    url = f"s3://{s3_env.bucket}/review-{uuid.uuid4().hex[:8]}"
    result = CliRunner().invoke(main, ["convert", str(local), url, "--to", "native", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert result.output.rstrip().endswith(f": {url}")  # was "s3:/bucket/...": click.Path folded the URL
    assert len(open_dataset(url, remote=RemoteOptions.from_keywords(block_cache_dir=tmp_path / "rc"))) == 40


def test_an_object_fetched_whole_larger_than_cache_limit_fails_at_once_naming_it(seaweed, tmp_path):
    """An index (or manifest) bigger than cache_limit can never fit: a named error now, not a 120 s wait."""
    import time

    from tokenloom.formats.errors import ConfigError

    rng = np.random.default_rng(0)
    with open_writer(tmp_path / "l", format="native", dtype="uint16", vocab_size=1000, eos_id=0) as writer:
        for _ in range(5000):  # one shard whose .idx is about 40 kB
            writer.add(np.append(rng.integers(1, 1000, size=3, dtype=np.uint16), np.uint16(0)))
    assert (tmp_path / "l" / "shard_00000.idx").stat().st_size > 6 * 4096
    url = seaweed.upload_dir(tmp_path / "l", f"review-{uuid.uuid4().hex[:8]}")
    started = time.monotonic()
    # (the .idx is read by blocks: the limit is refused for the blocks in flight instead)
    with pytest.raises(ConfigError, match=r"cache_limit 24576") as caught:
        remote = RemoteOptions.from_keywords(
            storage_options=seaweed.storage_options(),
            block_cache_dir=tmp_path / "c",
            block_size=4096,
            cache_limit=6 * 4096,
        )
        ds = open_dataset(url, remote=remote)
        ds[0]
    assert time.monotonic() - started < 20, "waited for room that can never be made"
    assert caught.value.hint and "cache_limit" in caught.value.hint


@pytest.mark.parametrize("endpoint", ["not-a-url", "127.0.0.1:9000", "ftp://host", "http://", "http://[::1"])
def test_a_malformed_endpoint_is_a_config_error_not_a_helper_panic(seaweed, tmp_path, endpoint):
    from tokenloom.formats.errors import ConfigError

    options = seaweed.storage_options(endpoint=endpoint)
    with pytest.raises(ConfigError, match="is not an http.s. URL") as caught:  # was a Rust panic killing the helper
        open_dataset(
            f"s3://{seaweed.bucket}/ds",
            remote=RemoteOptions.from_keywords(storage_options=options, block_cache_dir=tmp_path / "c", retries=0),
        )
    assert "storage_options['endpoint']" in str(caught.value)


def test_reads_go_on_after_the_helper_process_dies(seaweed, tmp_path, monkeypatch):
    """A killed helper (OOM killer, a panic) fails the call in flight; the next call starts a new one."""
    import os
    import signal

    from tokenloom.formats.errors import StorageError
    from tokenloom.formats.remote import _runtime, helper

    # this process may have run obstore itself (the fixtures upload with it): as a top-level process
    # that never did, it goes through the helper
    monkeypatch.setattr(_runtime, "_owner", None)

    url = seaweed.upload_dir(_write_native(tmp_path / "l"), f"review-{uuid.uuid4().hex[:8]}")
    options = seaweed.storage_options()
    open_dataset(url, remote=RemoteOptions.from_keywords(storage_options=options, block_cache_dir=tmp_path / "c0"))
    dead = helper._helper()  # pyright: ignore[reportPrivateUsage]
    os.kill(dead.process.pid, signal.SIGKILL)
    dead.process.wait()
    with pytest.raises(StorageError, match="ended unexpectedly"):
        open_dataset(url, remote=RemoteOptions.from_keywords(storage_options=options, block_cache_dir=tmp_path / "c1"))
    ds = open_dataset(
        url, remote=RemoteOptions.from_keywords(storage_options=options, block_cache_dir=tmp_path / "c2")
    )  # was: the same dead helper, forever
    assert len(ds) == 40 and helper._helper() is not dead  # pyright: ignore[reportPrivateUsage]
