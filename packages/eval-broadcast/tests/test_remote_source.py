"""An eval set whose source is a dataset on a real S3 server: same rows, local caches, a changed object re-keys."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from tokenloom.eval_broadcast import PathEvalSource, broadcast_eval_set
from tokenloom.eval_broadcast._command import eval_cache
from tokenloom.formats import RemoteOptions, open_writer


def _val(root):
    with open_writer(root, dtype="uint16", vocab_size=100, eos_id=99) as writer:
        writer.add_batch(np.array([1, 2, 99, 3, 4, 5, 99, 6, 99]), np.array([3, 4, 2]))
    return root


def test_a_url_source_gives_the_local_rows_and_caches_locally(seaweed, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = _val(tmp_path / "val")
    prefix = f"val-{uuid.uuid4().hex[:8]}"
    url = seaweed.upload_dir(local, prefix)
    remote = RemoteOptions.from_keywords(storage_options=seaweed.storage_options(), block_cache_dir=tmp_path / "blocks")
    source = PathEvalSource(url, remote=remote)
    assert source.path == url and source.remote is not None and source.remote.block_cache_dir == tmp_path / "blocks"
    evalset = broadcast_eval_set(source, seq_len=3, cache_dir=tmp_path / "evalcache")
    reference = broadcast_eval_set(PathEvalSource(local), seq_len=3)
    assert evalset.numpy().tolist() == reference.numpy().tolist()
    assert evalset.cache_path is not None and tmp_path / "evalcache" in Path(evalset.cache_path).parents
    again = broadcast_eval_set(PathEvalSource(url, remote=remote), seq_len=3, cache_dir=tmp_path / "evalcache")
    assert again.origin == "cache"
    as_value = PathEvalSource(url, remote=source.remote)  # the value it carries
    assert as_value.fingerprint() == source.fingerprint()
    assert not (tmp_path / "s3:").exists() and list((tmp_path / "blocks").rglob("whole"))
    before = source.fingerprint()
    changed = bytearray((local / "shard_00000.bin").read_bytes())
    changed[:2] = b"\x05\x00"
    seaweed.put(f"{prefix}/shard_00000.bin", bytes(changed))  # same size, new ETag
    assert PathEvalSource(url, remote=remote).fingerprint() != before  # a changed object is never served from the cache


def test_the_command_takes_a_url(seaweed, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = seaweed.upload_dir(_val(tmp_path / "val"), f"val-{uuid.uuid4().hex[:8]}")
    env = {**seaweed.env, "AWS_ENDPOINT_URL": seaweed.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1"}
    for name, value in {**env, "TOKENLOOM_CACHE_DIR": str(tmp_path / "blocks")}.items():
        monkeypatch.setenv(name, value)
    # the remote helper process receives the caller's AWS_* variables with every request: nothing to restart
    result = CliRunner().invoke(eval_cache, ["--path", url, "--seq-len", "3", "--cache-dir", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    assert list((tmp_path / "c").glob("eval-*")) and not (tmp_path / "s3:").exists()
    missing = CliRunner().invoke(eval_cache, ["--path", "nope", "--seq-len", "3", "--cache-dir", str(tmp_path / "c")])
    assert missing.exit_code != 0 and "--path nope does not exist" in missing.output
    assert os.environ["AWS_ENDPOINT_URL"] == seaweed.endpoint
