"""--executor ray on a real local Ray head (127.0.0.1, 2 CPUs; the ``ray_head`` fixture of conftest), started once
for the module and stopped at the end.

Skipped only when ray cannot be imported (the tokenize tox env installs the ``ray`` extra, so CI runs it).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from tokenize_helpers import free_port, numbered_parts, ray_config

# read by ray at import: its workers must use this environment's Python, not a `uv run` of their own
os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
pytest.importorskip("ray")

from tokenloom.formats import ConfigError, RecordError
from tokenloom.tokenize import ExecutorKind, TokenizeConfig, tokenize

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform != "linux", reason="a local Ray head")]


def _config(corpus: Path, out: Path, tokenizer: Path, **extra: object) -> TokenizeConfig:
    return TokenizeConfig(
        input_dir=corpus,
        output_dir=out,
        tokenizer=str(tokenizer),
        shard_size_tokens=3000,
        seq_len=64,
        overlap_size=8,
        **extra,  # type: ignore[arg-type]
    )


@pytest.fixture
def corpus(jsonl_dir: Callable[..., Path], make_texts: Callable[..., list[str]]) -> Path:
    return jsonl_dir(numbered_parts(make_texts, 5, 2, 120, 30))


def test_ray_tasks_write_the_local_pools_bytes(
    ray_head: str,
    corpus: Path,
    tmp_path: Path,
    tiny_tokenizer: Path,
    tree_digest: Callable[[Path], dict[str, str]],
) -> None:
    local = tmp_path / "local"
    tokenize(_config(corpus, local, tiny_tokenizer, num_nodes=1, num_workers=2))
    out = tmp_path / "ray"
    summary = tokenize(_config(corpus, out, tiny_tokenizer, executor=ExecutorKind.RAY, ray_address=ray_head))
    assert summary.units_committed == 5 and summary.units_total == 0
    assert tree_digest(out) == tree_digest(local)


def test_ray_tasks_write_the_local_pools_bytes_with_sub_file_units(
    ray_head: str,
    tmp_path: Path,
    tiny_tokenizer: Path,
    make_texts: Callable[..., list[str]],
    tree_digest: Callable[[Path], dict[str, str]],
) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    corpus = tmp_path / "in"
    corpus.mkdir()
    (corpus / "big.jsonl").write_bytes(b"".join(orjson.dumps({"text": t}) + b"\n" for t in make_texts(700, seed=5)))
    pq.write_table(pa.table({"text": make_texts(400, seed=6)}), corpus / "rows.parquet", row_group_size=100)
    local = tmp_path / "local"
    tokenize(_config(corpus, local, tiny_tokenizer, num_nodes=1, num_workers=2, unit_bytes=6000))
    out = tmp_path / "ray"
    config = _config(corpus, out, tiny_tokenizer, executor=ExecutorKind.RAY, ray_address=ray_head, unit_bytes=6000)
    summary = tokenize(config)
    assert summary.units_committed >= 5 and summary.units_total == 0  # one big file became several units
    assert tree_digest(out) == tree_digest(local)


def test_a_bad_record_in_a_ray_task_is_the_named_error(
    ray_head: str, jsonl_dir: Callable[..., Path], tmp_path: Path, tiny_tokenizer: Path
) -> None:
    corpus = jsonl_dir({"a.jsonl": [{"text": "fine"}]}, raw={"b.jsonl": b'{"text": "ok"}\n{"text": broken\n'})
    config = ray_config(corpus, tmp_path / "out", tiny_tokenizer, ray_head)
    with pytest.raises(RecordError, match="not valid JSON") as caught:
        tokenize(config)
    assert caught.value.path is not None and str(caught.value.path).endswith("b.jsonl")
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_an_unreachable_cluster_is_a_config_error_without_a_hang(
    corpus: Path, tmp_path: Path, tiny_tokenizer: Path
) -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    config = ray_config(corpus, tmp_path / "out", tiny_tokenizer, address)
    started = time.monotonic()
    with pytest.raises(ConfigError, match=rf"the Ray cluster at {address} cannot be reached"):
        tokenize(config)
    assert time.monotonic() - started < 15
    assert not (tmp_path / "out").exists()  # nothing written before the check
