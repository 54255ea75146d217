"""tokenize --train-type sft|dpo|grpo --output-dir s3://...: each unit's record store uploaded as it commits, the
last node merges them in plan order (the local merge) and uploads the store, manifest.json last (real S3 server).

The objects at the URL are the local run's files byte for byte, for one process, two nodes, 503s and resets on
the uploads, and a SIGKILL mid-upload followed by a rerun; open_records(URL) reads the local store's records.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from tokenize_helpers import REMOTE_TOKENIZE_SCRIPT, kill_script_when, wait_group_gone

from tokenloom.formats import (
    ChecksumError,
    MissingFileError,
    RemoteOptions,
    ResumeMismatchError,
    open_records,
    read_manifest,
)
from tokenloom.tokenize import TokenizeConfig, tokenize

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses SIGKILL and process groups")


def _record(train_type: str, i: int) -> dict[str, Any]:
    if train_type == "sft":
        turns = [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": "word " * (1 + i % 7)}]
        return {"messages": turns}
    if train_type == "dpo":
        return {"prompt": f"pick {i}", "chosen": f"good answer {i}", "rejected": "bad " * (1 + i % 4)}
    n = 1 + i % 3
    return {"prompt": [{"role": "user", "content": f"solve {i}"}], "responses": [f"try {j}" for j in range(n)],
            "rewards": [float(j) - 0.5 for j in range(n)]}  # fmt: skip


@pytest.fixture
def records_dir(tmp_path: Path):
    def make(train_type: str, n: int = 60) -> Path:
        directory = tmp_path / f"in-{train_type}"
        directory.mkdir()
        for part in range(2):
            lines = [orjson.dumps(_record(train_type, part * n + i)) + b"\n" for i in range(n)]
            (directory / f"part{part}.jsonl").write_bytes(b"".join(lines))
        return directory

    return make


def _url(seaweed) -> str:
    return f"s3://{seaweed.bucket}/rec-{uuid.uuid4().hex[:8]}"


def _options(train_type: str, corpus: Path, tokenizer: Path, **extra: Any) -> dict[str, Any]:
    return {"input_dir": corpus, "tokenizer": str(tokenizer), "train_type": train_type, "unit_bytes": 900,
            "num_workers": 0, **extra}  # fmt: skip


def _local(options: dict[str, Any], out: Path) -> Path:
    tokenize(TokenizeConfig(**{**options, "output_dir": out}))
    return out


def _bucket(seaweed, options: dict[str, Any], url: str, cache: Path, endpoint: str | None = None, **extra: Any):
    remote = RemoteOptions.from_keywords(storage_options=seaweed.storage_options(endpoint))
    config = TokenizeConfig(**{**options, **extra, "output_dir": url}, remote=remote, plan_cache_dir=cache)
    return tokenize(config)


def _same_files(local: Path, objects: dict[str, bytes]) -> None:
    """The URL holds the local store's files (plan, <key>.bin, meta.json, sidecar, manifest), byte for byte."""
    assert sorted(objects) == sorted(p.name for p in local.iterdir())
    for name, data in objects.items():
        assert data == (local / name).read_bytes(), name


def _reader_env(monkeypatch, seaweed, cache: Path) -> None:
    for name, value in {**seaweed.shell_env(), "TOKENLOOM_CACHE_DIR": str(cache)}.items():
        monkeypatch.setenv(name, value)


def _records(store) -> list[dict[str, bytes]]:
    return [{k: np.asarray(v).tobytes() for k, v in store.record(i).items()} for i in range(len(store))]


@pytest.mark.parametrize("train_type", ["sft", "dpo", "grpo"])
def test_records_to_a_bucket_equal_a_local_run(
    train_type, seaweed, records_dir, chat_tokenizer_dir, tmp_path, monkeypatch
) -> None:
    options = _options(train_type, records_dir(train_type), chat_tokenizer_dir("chatml"))
    local = _local(options, tmp_path / "local")
    url = _url(seaweed)
    summary = _bucket(seaweed, options, url, tmp_path / "cache", num_workers=2)
    assert str(summary.output_dir) == url and summary.units_committed > 2 and not summary.units_missing
    _same_files(local, seaweed.objects(url))
    assert read_manifest(local).metadata["layout"] == "records"
    _reader_env(monkeypatch, seaweed, tmp_path / "read-cache")
    remote = open_records(url)
    assert len(remote) == len(open_records(local)) > 0
    assert _records(remote) == _records(open_records(local))
    assert not any((tmp_path / "cache" / "uploads").rglob("unit_*")), "the staging directory is removed"
    again = _bucket(seaweed, options, url, tmp_path / "cache")
    assert again.already_complete and again.documents == summary.documents


def test_two_nodes_each_upload_their_units_and_the_last_merges(
    seaweed, records_dir, chat_tokenizer_dir, tmp_path
) -> None:
    options = _options("dpo", records_dir("dpo"), chat_tokenizer_dir("chatml"))
    local = _local(options, tmp_path / "local")
    url = _url(seaweed)
    first = _bucket(seaweed, options, url, tmp_path / "cache0", num_nodes=2, node_rank=1)
    assert first.units_missing > 0
    names = set(seaweed.objects(url))
    assert "manifest.json" not in names and "meta.json" not in names
    assert any(n.startswith("unit_") and n.endswith("/unit-meta.json") for n in names)  # node 1's unit stores
    last = _bucket(seaweed, options, url, tmp_path / "cache1", num_nodes=2, node_rank=0)  # fetches node 1's stores
    assert not last.units_missing
    _same_files(local, seaweed.objects(url))


def test_503s_and_resets_on_the_uploads_give_the_same_bytes(
    seaweed, fault_proxy, records_dir, chat_tokenizer_dir, tmp_path
) -> None:
    options = _options("sft", records_dir("sft"), chat_tokenizer_dir("chatml"))
    local = _local(options, tmp_path / "local")
    url = _url(seaweed)
    fault_proxy.fault_methods = {"PUT", "POST"}
    fault_proxy.faults = ["503", "reset", "503", "reset", "503", "503"]
    _bucket(seaweed, options, url, tmp_path / "cache", endpoint=fault_proxy.url)
    assert fault_proxy.faults == [] and sum(fault_proxy.injected.values()) == 6
    _same_files(local, seaweed.objects(url))


SCRIPT = REMOTE_TOKENIZE_SCRIPT


@pytest.mark.parametrize("kill_at", ["units", "merged store"])
def test_sigkill_mid_upload_then_rerun_completes(
    kill_at, seaweed, fault_proxy, records_dir, chat_tokenizer_dir, tmp_path
) -> None:
    options = _options("grpo", records_dir("grpo"), chat_tokenizer_dir("chatml"))
    local = _local(options, tmp_path / "local")
    url = _url(seaweed)
    kwargs = {k: str(v) if isinstance(v, Path) else v for k, v in options.items()}
    kwargs.update(output_dir=url, storage_options=seaweed.storage_options(fault_proxy.url))
    kwargs["plan_cache_dir"] = str(tmp_path / "cache")
    fault_proxy.fault_methods = {"PUT"}
    fault_proxy.stall_seconds = 0.1
    fault_proxy.faults = ["stall"] * 10_000  # every upload is slow: the kill lands mid-upload

    def ready() -> bool:
        if kill_at == "units":
            return sum(1 for path in fault_proxy.uploads if "/unit_" in path) >= 3
        return any(path.endswith(".bin") and "/unit_" not in path for path in fault_proxy.uploads)

    wait_group_gone(kill_script_when(SCRIPT, kwargs, ready, timeout=120), poll=0.05)
    fault_proxy.wait_idle()
    assert "manifest.json" not in seaweed.objects(url)
    fault_proxy.faults = []
    summary = _bucket(seaweed, options, url, tmp_path / "cache", endpoint=fault_proxy.url)
    assert not summary.units_missing
    _same_files(local, seaweed.objects(url))


def test_format_h5_into_a_bucket_equals_a_local_run_and_its_blocks_are_verified(
    seaweed, records_dir, chat_tokenizer_dir, tmp_path, monkeypatch
) -> None:
    """--format h5: data.h5 merged in the last node's staging directory, uploaded with the sidecar, then the
    manifest (block hashes of data.h5); open_records(URL) reads it through verified blocks."""
    pytest.importorskip("h5py")
    options = _options("grpo", records_dir("grpo"), chat_tokenizer_dir("chatml"), format="h5")
    local = _local(options, tmp_path / "local")
    assert (local / "manifest.json").is_file() and read_manifest(local).format == "h5"
    url = _url(seaweed)
    first = _bucket(seaweed, options, url, tmp_path / "cache0", num_nodes=2, node_rank=0)
    assert first.units_missing > 0 and "data.h5" not in seaweed.objects(url)
    _bucket(seaweed, options, url, tmp_path / "cache1", num_nodes=2, node_rank=1)
    objects = seaweed.objects(url)
    _same_files(local, objects)
    entry = next(f for f in read_manifest(local).files if f.name == "data.h5")
    assert entry.role == "data" and entry.blocks is not None
    _reader_env(monkeypatch, seaweed, tmp_path / "read-cache")
    assert _records(open_records(url)) == _records(open_records(local))
    assert _bucket(seaweed, options, url, tmp_path / "cache2").already_complete
    damaged = bytearray(objects["data.h5"])
    damaged[len(damaged) // 2] ^= 0xFF  # a byte of some record's data: the size stays, a block hash does not
    seaweed.put(f"{url.split(seaweed.bucket + '/', 1)[1]}/data.h5", bytes(damaged))
    monkeypatch.setenv("TOKENLOOM_CACHE_DIR", str(tmp_path / "read-cache-2"))
    with pytest.raises(ChecksumError, match="never matched the manifest"):
        _records(open_records(url))


def test_other_settings_are_refused_and_overwrite_replaces_the_store(
    seaweed, records_dir, chat_tokenizer_dir, tmp_path
) -> None:
    options = _options("dpo", records_dir("dpo"), chat_tokenizer_dir("chatml"))
    url = _url(seaweed)
    _bucket(seaweed, options, url, tmp_path / "cache")
    other = {**options, "seq_len": 24, "truncate": "keep-start"}
    with pytest.raises(ResumeMismatchError, match="record store written with other settings"):
        _bucket(seaweed, other, url, tmp_path / "cache")
    _bucket(seaweed, other, url, tmp_path / "cache", overwrite=True)
    _same_files(_local(other, tmp_path / "local"), seaweed.objects(url))


@pytest.mark.parametrize("format", ["bin-meta", "h5"])
def test_a_store_whose_run_did_not_upload_its_manifest_is_not_read(
    format, seaweed, records_dir, chat_tokenizer_dir, tmp_path, monkeypatch
) -> None:
    """What a run killed after its store's upload and before manifest.json (uploaded last) leaves: the store's
    files and the run's plan. open_records(URL) read it as complete; it is a MissingFileError until the
    manifest is there."""
    if format == "h5":
        pytest.importorskip("h5py")
    local = _local(_options("sft", records_dir("sft"), chat_tokenizer_dir("chatml"), format=format), tmp_path / "l")
    url = _url(seaweed)
    prefix = url.split(f"{seaweed.bucket}/", 1)[1]
    for path in sorted(local.iterdir()):
        if path.name != "manifest.json":
            seaweed.put(f"{prefix}/{path.name}", path.read_bytes())
    _reader_env(monkeypatch, seaweed, tmp_path / "read-cache")
    with pytest.raises(MissingFileError, match="without its manifest.json"):
        open_records(url)
    seaweed.put(f"{prefix}/manifest.json", (local / "manifest.json").read_bytes())
    assert _records(open_records(url)) == _records(open_records(local))
