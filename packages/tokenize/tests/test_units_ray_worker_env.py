"""--executor ray whose workers hold other credentials than the driver: a real local Ray head and a real S3 server.

The driver lists the bucket and creates the plan with its own (right) credentials; the head, and so its workers,
holds a wrong secret. The refusal comes from a worker and must say so: checking the driver's variables would not help.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

# read by ray at import: its workers must use this environment's Python, not a `uv run` of their own
os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
pytest.importorskip("ray")
pytest.importorskip("obstore")

from tokenloom.formats import StorageError
from tokenloom.tokenize import ExecutorKind, TokenizeConfig, tokenize

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform != "linux", reason="a local Ray head")]

WRONG_SECRET = "wrong-worker-secret-7d2e"


@pytest.fixture(scope="module")
def ray_head_env(seaweed, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    cache = tmp_path_factory.mktemp("worker-cache")
    return {**seaweed.shell_env(), "AWS_SECRET_ACCESS_KEY": WRONG_SECRET, "TOKENLOOM_CACHE_DIR": str(cache)}


@pytest.fixture
def driver(seaweed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {**seaweed.env, "AWS_ENDPOINT_URL": seaweed.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TOKENLOOM_CACHE_DIR", str(tmp_path / "driver-cache"))


@pytest.mark.parametrize("side", ["input", "output"])
def test_a_worker_refused_by_the_bucket_is_named_as_the_ray_worker(
    seaweed, ray_head, driver, jsonl_dir, tiny_tokenizer, tmp_path, side
):
    local = jsonl_dir({"a.jsonl": [{"text": f"document {i}"} for i in range(20)]})
    prefix = f"s3://{seaweed.bucket}/worker-env-{side}"
    if side == "input":
        seaweed.upload_tree(local, f"worker-env-{side}")
    source, target = (prefix, tmp_path / "out") if side == "input" else (local, prefix)
    config = TokenizeConfig(
        input_dir=source,  # type: ignore[arg-type]
        output_dir=target,  # type: ignore[arg-type]
        tokenizer=str(tiny_tokenizer),
        seq_len=64,
        executor=ExecutorKind.RAY,
        ray_address=ray_head,
    )
    with pytest.raises(StorageError, match="was refused") as caught:
        tokenize(config)
    message = str(caught.value)
    assert f"on the Ray worker on {socket.gethostname()}" in message  # one local head: the worker is this host
    assert "TOKENLOOM_CACHE_DIR" not in caught.value.problem  # the hint says where; the problem is unchanged
    assert WRONG_SECRET not in message and seaweed.env["AWS_SECRET_ACCESS_KEY"] not in message
