"""Defects a review of the object-storage wave found, each pinned by a test (real SeaweedFS S3 server, no mocks)."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tokenloom.formats import open_dataset, open_writer


def _write_native(root: Path) -> Path:
    rng = np.random.default_rng(0)
    with open_writer(root, format="native", dtype="uint16", vocab_size=1000, eos_id=0, shard_size_tokens=2000) as w:
        for _ in range(40):
            w.add(np.append(rng.integers(1, 1000, size=int(rng.integers(5, 200)), dtype=np.uint16), np.uint16(0)))
    return root


@pytest.fixture
def s3_env(seaweed, monkeypatch, tmp_path):
    from tokenloom.formats.remote.local_servers import S3_ACCESS_KEY, S3_SECRET

    for name, value in {
        "AWS_ENDPOINT_URL": seaweed.endpoint,
        "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": S3_SECRET,
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
        "TOKENLOOM_CACHE_DIR": str(tmp_path / "cache"),
    }.items():
        monkeypatch.setenv(name, value)
    return seaweed


def test_cli_convert_to_s3_names_the_target_url_not_a_folded_path(s3_env, tmp_path):
    from tokenloom.formats.cli.group import main

    local = _write_native(tmp_path / "local")
    url = f"s3://{s3_env.bucket}/review-{uuid.uuid4().hex[:8]}"
    result = CliRunner().invoke(main, ["convert", str(local), url, "--to", "native", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert result.output.rstrip().endswith(f": {url}")  # was "s3:/bucket/...": click.Path folded the URL
    assert len(open_dataset(url, cache_dir=tmp_path / "rc")) == 40
