"""--executor ray with inputs and outputs in object storage: a real local Ray head and a real S3 server.

The head (``ray_head`` of conftest, once for the module) starts its workers with the S3 server's variables and a
cache directory of their own, as a cluster's machines have: a task that used the driver's cache paths would leave
the workers' cache empty.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from tokenize_helpers import upload_prefix

from tokenloom.formats import RemoteOptions

# read by ray at import: its workers must use this environment's Python, not a `uv run` of their own
os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
pytest.importorskip("ray")
pytest.importorskip("obstore")

from tokenloom.formats import ConfigError, MissingFileError, RecordError, open_dataset
from tokenloom.tokenize import ExecutorKind, TokenizeConfig, tokenize

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform != "linux", reason="a local Ray head")]

OPTIONS: dict[str, Any] = {"shard_size_tokens": 2000, "chunk_lines": 30, "seq_len": 64, "overlap_size": 8}


@pytest.fixture(scope="module")
def ray_head_env(s3_worker_env: dict[str, str]) -> dict[str, str]:
    return s3_worker_env


@pytest.fixture
def corpus(jsonl_dir, make_texts) -> Path:
    texts = make_texts(500, seed=21)
    files: dict[str, list[object]] = {f"sub/part{i}.jsonl": [{"text": t} for t in texts[i * 100 : (i + 1) * 100]]
                                      for i in range(4)}  # fmt: skip
    files["part4.jsonl.gz"] = [{"text": t} for t in texts[400:]]
    return jsonl_dir(files)


@pytest.fixture
def driver(seaweed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test process is the driver: the S3 server's variables, and a cache of its own; returns that cache."""
    env = {**seaweed.env, "AWS_ENDPOINT_URL": seaweed.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cache = tmp_path / "driver-cache"
    monkeypatch.setenv("TOKENLOOM_CACHE_DIR", str(cache))
    return cache


def _target(seaweed, name: str) -> str:
    return f"s3://{seaweed.bucket}/{name}-{uuid.uuid4().hex[:8]}"


def _config(input_dir: object, output_dir: object, tokenizer: Path, **extra: Any) -> TokenizeConfig:
    return TokenizeConfig(
        input_dir=input_dir,  # type: ignore[arg-type]
        output_dir=output_dir,  # type: ignore[arg-type]
        tokenizer=str(tokenizer),
        **{**OPTIONS, **extra},
    )


def _ray(input_dir: object, output_dir: object, tokenizer: Path, address: str, **extra: Any) -> TokenizeConfig:
    return _config(input_dir, output_dir, tokenizer, executor=ExecutorKind.RAY, ray_address=address, **extra)


def _pool(input_dir: object, output_dir: object, tokenizer: Path, **extra: Any) -> TokenizeConfig:
    """The local pool's unit-planned run (one node, two workers): what a Ray run must equal."""
    return _config(input_dir, output_dir, tokenizer, num_nodes=1, num_workers=2, **extra)


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def _shards(found: dict[str, bytes]) -> dict[str, bytes]:
    return {name: data for name, data in found.items() if name.endswith((".bin", ".idx"))}


def test_ray_from_s3_into_s3_puts_the_objects_the_local_pool_puts(
    seaweed, ray_head, driver, worker_cache, corpus, tiny_tokenizer, tmp_path
):
    source = upload_prefix(seaweed, corpus, "raw")
    pool, ray = _target(seaweed, "pool"), _target(seaweed, "ray")
    tokenize(_pool(source, pool, tiny_tokenizer))
    summary = tokenize(_ray(source, ray, tiny_tokenizer, ray_head))
    assert summary.units_committed == 5 and summary.documents == 500
    assert summary.output_dir == ray
    expected = seaweed.objects(pool)
    assert "manifest.json" in expected and ".tokenloom-plan.json" in expected
    assert seaweed.objects(ray) == expected  # plan, done markers, shards and manifest: the same bytes
    disk = tmp_path / "disk"  # and the shards a local-disk run writes from the local copy of the inputs
    tokenize(_pool(corpus, disk, tiny_tokenizer))
    assert _shards(expected) == _shards(_files(disk))
    # the tasks fetched their units' inputs into the workers' cache, staged there, and left no shard behind
    fetched = sorted(p.name for p in (worker_cache / "inputs").rglob("*") if p.is_file())
    assert fetched.count("part4.jsonl.gz") >= 1 and all(fetched.count(f"part{i}.jsonl") >= 1 for i in range(4))
    assert not [p for p in worker_cache.rglob("unit_*") if p.is_file()]
    assert not [p for p in driver.rglob("unit_*") if p.is_file()]  # nor did the driver encode any unit
    again = tokenize(_ray(source, ray, tiny_tokenizer, ray_head))
    assert again.already_complete


def test_ray_from_s3_into_a_local_dir_equals_the_local_pool(
    seaweed, ray_head, driver, corpus, tiny_tokenizer, tree_digest, tmp_path
):
    source = upload_prefix(seaweed, corpus, "raw")
    tokenize(_pool(source, tmp_path / "pool", tiny_tokenizer))
    summary = tokenize(_ray(source, tmp_path / "ray", tiny_tokenizer, ray_head))
    assert summary.units_committed == 5
    assert tree_digest(tmp_path / "ray") == tree_digest(tmp_path / "pool")


def test_ray_from_a_local_dir_into_s3_equals_the_local_pool(seaweed, ray_head, driver, corpus, tiny_tokenizer):
    pool, ray = _target(seaweed, "pool"), _target(seaweed, "ray")
    tokenize(_pool(corpus, pool, tiny_tokenizer))
    summary = tokenize(_ray(corpus, ray, tiny_tokenizer, ray_head))
    assert summary.units_committed == 5
    expected = seaweed.objects(pool)
    assert "manifest.json" in expected
    assert seaweed.objects(ray) == expected


def test_a_ray_rerun_runs_only_the_units_not_committed_in_the_bucket(seaweed, ray_head, driver, corpus, tiny_tokenizer):
    source = upload_prefix(seaweed, corpus, "raw")
    pool, ray = _target(seaweed, "pool"), _target(seaweed, "ray")
    tokenize(_pool(source, pool, tiny_tokenizer))
    # node 0 of 2 commits units 0, 2 and 4 there (no manifest yet); then Ray takes over the run
    first = tokenize(_config(source, ray, tiny_tokenizer, num_nodes=2, node_rank=0))
    assert first.units_committed == 3 and first.units_missing == 2
    committed = {name: data for name, data in seaweed.objects(ray).items() if name.endswith(".done")}
    assert len(committed) == 3
    summary = tokenize(_ray(source, ray, tiny_tokenizer, ray_head))
    assert summary.units_committed == 2  # units 1 and 3 alone ran as tasks
    found = seaweed.objects(ray)
    assert found == seaweed.objects(pool)
    assert {name: found[name] for name in committed} == committed


def test_a_bad_record_in_a_ray_task_from_s3_is_named_by_its_url_and_nothing_is_published(
    seaweed, ray_head, driver, tiny_tokenizer, tmp_path
):
    good = "".join(f'{{"text": "fine document {i}"}}\n' for i in range(20)).encode()
    key = f"bad-{uuid.uuid4().hex[:8]}"
    seaweed.put(f"{key}/a.jsonl", good)
    seaweed.put(f"{key}/b.jsonl", b'{"text": "ok"}\n{"text": broken\n')
    target = _target(seaweed, "ray")
    with pytest.raises(RecordError, match="not valid JSON") as caught:
        tokenize(_ray(f"s3://{seaweed.bucket}/{key}", target, tiny_tokenizer, ray_head))
    assert caught.value.path == f"s3://{seaweed.bucket}/{key}/b.jsonl" and caught.value.record == 2
    assert "manifest.json" not in seaweed.objects(target)
    with pytest.raises(MissingFileError):  # a reader finds no dataset there
        open_dataset(target, remote=RemoteOptions.from_keywords(block_cache_dir=tmp_path / "read"))


def test_an_unreachable_cluster_puts_nothing_at_the_output_url(seaweed, driver, corpus, tiny_tokenizer):
    source = upload_prefix(seaweed, corpus, "raw")
    target = _target(seaweed, "ray")
    with pytest.raises(ConfigError, match="the Ray cluster at 127.0.0.1:1 cannot be reached"):
        tokenize(_ray(source, target, tiny_tokenizer, "127.0.0.1:1"))
    assert seaweed.objects(target) == {}  # not even the plan: the cluster is checked before the URL is written
