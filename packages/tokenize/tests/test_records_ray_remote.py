"""tokenize --train-type with --executor ray into s3://: each Ray task stages its unit's record store in its own
machine's cache and uploads it (store, then done marker), the driver merges the stores as the last node of a
--num-nodes run does and uploads the store, manifest.json last. A real local Ray head and a real S3 server.

The objects at the URL are a local one-process run's files byte for byte (bin-meta and h5, from a local input and
from an s3:// input), a rerun is complete, and Ray finishing a --num-nodes run puts the same bytes.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

# read by ray at import: its workers must use this environment's Python, not a `uv run` of their own
os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
pytest.importorskip("ray")
pytest.importorskip("obstore")

from tokenloom.formats import open_records
from tokenloom.tokenize import ExecutorKind, TokenizeConfig, tokenize

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform != "linux", reason="a local Ray head")]


def _record(train_type: str, i: int) -> dict[str, Any]:
    if train_type == "sft":
        turns = [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": "word " * (1 + i % 7)}]
        return {"messages": turns}
    n = 1 + i % 3
    return {"prompt": [{"role": "user", "content": f"solve {i}"}], "responses": [f"try {j}" for j in range(n)],
            "rewards": [float(j) - 0.5 for j in range(n)]}  # fmt: skip


@pytest.fixture(scope="module")
def ray_head_env(s3_worker_env: dict[str, str]) -> dict[str, str]:
    return s3_worker_env


@pytest.fixture
def driver(seaweed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test process is the driver: the S3 server's variables and a cache of its own; returns that cache."""
    for name, value in seaweed.shell_env().items():
        monkeypatch.setenv(name, value)
    cache = tmp_path / "driver-cache"
    monkeypatch.setenv("TOKENLOOM_CACHE_DIR", str(cache))
    return cache


def _corpus(directory: Path, train_type: str, n: int = 40) -> Path:
    directory.mkdir()
    for part in range(2):
        lines = [orjson.dumps(_record(train_type, part * n + i)) + b"\n" for i in range(n)]
        (directory / f"part{part}.jsonl").write_bytes(b"".join(lines))
    return directory


def _config(input_dir: object, output_dir: object, tokenizer: Path, train_type: str, **extra: Any) -> TokenizeConfig:
    return TokenizeConfig(input_dir=input_dir, output_dir=output_dir, tokenizer=str(tokenizer),  # type: ignore[arg-type]
                          train_type=train_type, unit_bytes=900, num_workers=0, **extra)  # fmt: skip


def _ray(*args: Any, address: str, **extra: Any) -> TokenizeConfig:
    return _config(*args, executor=ExecutorKind.RAY, ray_address=address, **extra)


def _url(seaweed, name: str) -> str:
    return f"s3://{seaweed.bucket}/{name}-{uuid.uuid4().hex[:8]}"


def _same_files(local: Path, objects: dict[str, bytes], *, plan: bool = True) -> None:
    """The store's files byte for byte; ``plan=False``: the plan names the inputs by ETag, not by local file."""
    assert sorted(objects) == sorted(p.name for p in local.iterdir())
    for name, data in objects.items():
        assert data == (local / name).read_bytes() or (name == ".tokenloom-plan.json" and not plan), name


@pytest.mark.parametrize(
    ("train_type", "store_format", "from_bucket"), [("sft", "bin-meta", True), ("grpo", "h5", False)]
)
def test_ray_tasks_into_a_bucket_put_the_local_runs_files(
    train_type, store_format, from_bucket, seaweed, ray_head, driver, worker_cache, chat_tokenizer_dir, tmp_path
) -> None:
    if store_format == "h5":
        pytest.importorskip("h5py")
    tok = chat_tokenizer_dir("chatml")
    corpus = _corpus(tmp_path / "in", train_type)
    local = tmp_path / "local"
    tokenize(_config(corpus, local, tok, train_type, format=store_format))
    source: object = corpus
    if from_bucket:
        source = _url(seaweed, "raw")
        seaweed.upload_tree(corpus, str(source).split(f"{seaweed.bucket}/", 1)[1])
    url = _url(seaweed, "ray")
    summary = tokenize(_ray(source, url, tok, train_type, format=store_format, address=ray_head))
    assert summary.units_committed > 2 and not summary.units_missing and summary.documents == 80
    assert summary.output_dir == url
    _same_files(local, seaweed.objects(url), plan=not from_bucket)  # data, sidecar, meta, manifest: the local bytes
    remote, mine = open_records(url), open_records(local)
    assert len(remote) == len(mine) == 80
    assert orjson.dumps(remote.record(79), option=orjson.OPT_SERIALIZE_NUMPY) == orjson.dumps(
        mine.record(79), option=orjson.OPT_SERIALIZE_NUMPY
    )
    # each task staged its unit in its worker's cache and removed it after the upload; the driver kept nothing
    assert not [p for p in worker_cache.rglob("unit_*") if p.is_file()]
    assert not [p for p in (driver / "uploads").rglob("*") if p.is_file()]
    again = tokenize(_ray(source, url, tok, train_type, format=store_format, address=ray_head))
    assert again.already_complete and again.documents == 80


def test_ray_finishes_a_num_nodes_run_with_the_same_bytes(seaweed, ray_head, driver, chat_tokenizer_dir, tmp_path):
    tok = chat_tokenizer_dir("chatml")
    corpus = _corpus(tmp_path / "in", "sft")
    local = tmp_path / "local"
    tokenize(_config(corpus, local, tok, "sft"))
    url = _url(seaweed, "mixed")
    first = tokenize(_config(corpus, url, tok, "sft", num_nodes=2, node_rank=1, plan_cache_dir=tmp_path / "node1"))
    assert first.units_missing > 0
    committed = {n: d for n, d in seaweed.objects(url).items() if n.endswith(".done")}
    assert committed
    summary = tokenize(_ray(corpus, url, tok, "sft", address=ray_head))  # the units node 1 did not commit
    assert summary.units_committed == first.units_total - len(committed)
    _same_files(local, seaweed.objects(url))
