"""tokenize --output-dir s3://...: units staged locally, each uploaded as it commits, manifest last (real S3 server)."""

from __future__ import annotations

import functools
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from tokenize_helpers import REMOTE_TOKENIZE_SCRIPT, kill_script_when, s3_cli_env, same_dataset, wait_group_gone

from tokenloom.formats import RemoteOptions, open_dataset
from tokenloom.formats.errors import ConfigError, MissingFileError, ResumeMismatchError
from tokenloom.testing.servers import S3_SECRET
from tokenloom.tokenize import TokenizeConfig, tokenize

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses SIGKILL and process groups")

OPTIONS: dict[str, Any] = {"shard_size_tokens": 3000, "chunk_lines": 40, "seq_len": 64, "overlap_size": 16}


@pytest.fixture
def corpus(jsonl_dir, make_texts) -> Path:
    texts = make_texts(900, seed=3)
    return jsonl_dir({f"part{i}.jsonl": [{"text": t} for t in texts[i * 300 : (i + 1) * 300]] for i in range(3)})


def _url(seaweed) -> str:
    return f"s3://{seaweed.bucket}/tok-{uuid.uuid4().hex[:8]}"


def _local(corpus: Path, tokenizer: Path, out: Path, **options: Any) -> Path:
    """The local run of one node: what one process puts at a URL (the unit layout)."""
    config = TokenizeConfig(input_dir=corpus, output_dir=out, tokenizer=str(tokenizer), num_workers=0, num_nodes=1,
                            **options)  # fmt: skip
    tokenize(config)
    return out


def _bucket_config(
    corpus: Path, url: str, tokenizer: Path, storage_options: dict[str, Any], cache: Path, **options: Any
) -> TokenizeConfig:
    """A run into the bucket URL (a string, as the CLI passes it), its plan cached under ``cache``, no workers
    unless told."""
    return TokenizeConfig(
        input_dir=corpus,
        output_dir=url,  # pyright: ignore[reportArgumentType]
        tokenizer=str(tokenizer),
        remote=RemoteOptions.from_keywords(storage_options=storage_options),
        plan_cache_dir=cache,
        **{"num_workers": 0, **options},
    )


def _tokens(ds) -> list[bytes]:
    return [np.asarray(ds[i]).tobytes() for i in range(len(ds))]


def test_tokenize_to_s3_equals_local(seaweed, corpus, tiny_tokenizer, tmp_path):
    local = _local(corpus, tiny_tokenizer, tmp_path / "local", **OPTIONS)
    url = _url(seaweed)
    cache = tmp_path / "cache"
    config = _bucket_config(corpus, url, tiny_tokenizer, seaweed.storage_options(), cache, num_workers=2, **OPTIONS)
    assert config.output_url == url
    assert S3_SECRET not in repr(config)  # credentials never in a config's repr (logs, errors)
    summary = tokenize(config)
    assert str(summary.output_dir) == url and summary.shards > 3
    same_dataset(local, seaweed.objects(url))
    remote = open_dataset(
        url,
        remote=RemoteOptions.from_keywords(
            storage_options=seaweed.storage_options(), block_cache_dir=tmp_path / "read-cache"
        ),
    )
    assert _tokens(remote) == _tokens(open_dataset(local))
    assert not any((cache / "uploads").rglob("unit_*")), "the staging directory is removed after the upload"
    again = tokenize(config)
    assert again.already_complete and again.shards == summary.shards


SCRIPT = REMOTE_TOKENIZE_SCRIPT


def _run_killed(kwargs: dict[str, Any], ready, timeout: float = 90) -> None:
    group = kill_script_when(SCRIPT, kwargs, ready, timeout)
    # the object-store helper too: a request it had in flight is then known to be dead
    assert wait_group_gone(group), f"process group {group} still alive 10 s after SIGKILL"


def test_sigkill_mid_upload_resumes_without_uploading_twice(seaweed, fault_proxy, corpus, tiny_tokenizer, tmp_path):
    local = _local(corpus, tiny_tokenizer, tmp_path / "local", **OPTIONS)
    url = _url(seaweed)
    kwargs: dict[str, Any] = {
        "input_dir": str(corpus),
        "output_dir": url,
        "tokenizer": str(tiny_tokenizer),
        "num_workers": 1,
        "storage_options": seaweed.storage_options(fault_proxy.url),  # JSON for the killed run: see SCRIPT
        "plan_cache_dir": str(tmp_path / "cache"),
        **OPTIONS,
    }
    fault_proxy.fault_methods = {"PUT"}
    fault_proxy.stall_seconds = 0.15
    fault_proxy.faults = ["stall"] * 10_000  # every upload is slow: the kill lands mid-upload

    def uploaded_shards() -> int:
        return sum(1 for path in fault_proxy.uploads if "/unit_" in path)

    _run_killed(kwargs, lambda: uploaded_shards() >= 4)
    fault_proxy.wait_idle()
    before = dict(fault_proxy.uploads)
    assert 4 <= len(before) < 2 * sum(1 for p in local.iterdir() if p.name.startswith("unit_"))
    with pytest.raises(MissingFileError, match="no native dataset at"):
        open_dataset(
            url,
            remote=RemoteOptions.from_keywords(
                storage_options=seaweed.storage_options(), block_cache_dir=tmp_path / "rc0"
            ),
        )
    fault_proxy.faults = []
    remote = RemoteOptions.from_keywords(storage_options=kwargs.pop("storage_options"))
    tokenize(TokenizeConfig(**{**kwargs, "input_dir": corpus, "plan_cache_dir": tmp_path / "cache"}, remote=remote))
    same_dataset(local, seaweed.objects(url))
    twice = {path: count for path, count in fault_proxy.uploads.items() if count != 1}
    assert twice == {}, f"uploaded more than once: {twice}"
    assert set(before) < set(fault_proxy.uploads)


def test_503_bursts_on_uploads_are_retried(seaweed, fault_proxy, corpus, tiny_tokenizer, tmp_path, caplog):
    local = _local(corpus, tiny_tokenizer, tmp_path / "local", **OPTIONS)
    url = _url(seaweed)
    fault_proxy.fault_methods = {"PUT", "POST"}
    fault_proxy.faults = ["503", "503", "503", "reset", "503"]
    with caplog.at_level("WARNING", logger="tokenloom.formats.remote"):
        tokenize(
            _bucket_config(
                corpus, url, tiny_tokenizer, seaweed.storage_options(fault_proxy.url), tmp_path / "cache", **OPTIONS
            )
        )
    assert fault_proxy.injected["503"] == 4 and fault_proxy.faults == []
    writes = ("uploading", "creating it once")  # the first PUTs: the plan's create, then the units' uploads
    waits = sum("waiting for" in r.getMessage() and any(w in r.getMessage() for w in writes) for r in caplog.records)
    assert 1 <= waits <= 4  # one line per distinct wait, not one per retry
    same_dataset(local, seaweed.objects(url))


def test_manifest_is_uploaded_last(seaweed, fault_proxy, corpus, tiny_tokenizer, tmp_path):
    local = _local(corpus, tiny_tokenizer, tmp_path / "local", **OPTIONS)
    before_manifest = {p.name for p in local.iterdir() if p.name != "manifest.json"}
    url = _url(seaweed)
    gate = threading.Event()
    fault_proxy.hold = {f"PUT /{url[5:]}/manifest.json": gate}  # the manifest's upload waits here
    config = _bucket_config(
        corpus, url, tiny_tokenizer, seaweed.storage_options(fault_proxy.url), tmp_path / "cache", **OPTIONS
    )
    failed: list[BaseException] = []

    def run() -> None:
        try:
            tokenize(config)
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not before_manifest <= set(seaweed.objects(url)) or not fault_proxy.in_flight:
            assert time.monotonic() < deadline and not failed, failed
            time.sleep(0.05)
        assert thread.is_alive()
        # a reader in another process (this one's object-store helper is busy uploading) finds no dataset yet
        reader = (
            "import json, sys\nfrom tokenloom.formats import RemoteOptions, open_dataset\n"
            "options = json.loads(sys.argv[2])\n"
            "remote = RemoteOptions.from_keywords(storage_options=options, block_cache_dir=sys.argv[3])\n"
            "open_dataset(sys.argv[1], remote=remote)"
        )
        options = orjson.dumps(seaweed.storage_options()).decode()
        done = subprocess.run(
            [sys.executable, "-c", reader, url, options, str(tmp_path / "rc")], capture_output=True, text=True
        )
        assert done.returncode != 0 and "MissingFileError" in done.stderr and "no native dataset at" in done.stderr
    finally:
        gate.set()
        thread.join(timeout=60)
    assert not failed
    same_dataset(local, seaweed.objects(url))


def test_existing_dataset_refused_unless_overwrite(seaweed, corpus, tiny_tokenizer, tmp_path, tree_digest):
    url = _url(seaweed)
    config = functools.partial(
        _bucket_config, corpus, url, tiny_tokenizer, seaweed.storage_options(), tmp_path / "cache"
    )
    tokenize(config(**OPTIONS))
    inputs_before = tree_digest(corpus)
    other = {**OPTIONS, "shard_size_tokens": 20_000}
    with pytest.raises(ResumeMismatchError, match="shard_size_tokens") as info:
        tokenize(config(**other))
    assert "--overwrite" in (info.value.hint or "")
    tokenize(config(**other, overwrite=True))
    local = _local(corpus, tiny_tokenizer, tmp_path / "local", **other)
    same_dataset(local, seaweed.objects(url))  # the first run's extra shards are gone
    assert tree_digest(corpus) == inputs_before  # --overwrite never touches the source


def test_foreign_objects_refused(seaweed, corpus, tiny_tokenizer, tmp_path):
    url = _url(seaweed)
    seaweed.put(url.split(f"{seaweed.bucket}/", 1)[1] + "/notes.txt", b"keep me")
    with pytest.raises(ConfigError, match="not a tokenize output"):
        tokenize(_bucket_config(corpus, url, tiny_tokenizer, seaweed.storage_options(), tmp_path / "cache"))


def test_a_dataset_of_the_old_shard_layout_is_refused_then_replaced_by_overwrite(
    seaweed, corpus, tiny_tokenizer, tmp_path
):
    from tokenloom.formats import open_writer

    old = tmp_path / "old"  # what one process put at a URL before: shard_NNNNN.bin/.idx beside the manifest
    with open_writer(old, format="native", dtype="uint16", vocab_size=1000, eos_id=0, shard_size_tokens=50) as writer:
        for length in range(5, 40):
            writer.add(np.arange(1, length + 1, dtype=np.int64))
    url = _url(seaweed)
    key = url.split(f"{seaweed.bucket}/", 1)[1]
    for path in old.iterdir():
        seaweed.put(f"{key}/{path.name}", path.read_bytes())
    assert any(name.startswith("shard_") for name in seaweed.objects(url))
    config = functools.partial(
        _bucket_config, corpus, url, tiny_tokenizer, seaweed.storage_options(), tmp_path / "cache"
    )
    with pytest.raises(ResumeMismatchError, match="layout") as info:
        tokenize(config(**OPTIONS))
    assert "--overwrite" in (info.value.hint or "")
    tokenize(config(**OPTIONS, overwrite=True))
    same_dataset(_local(corpus, tiny_tokenizer, tmp_path / "local", **OPTIONS), seaweed.objects(url))


@pytest.mark.parametrize(
    ("output", "options", "match"),
    [
        ("s3://b/ds", {"format": "megatron"}, "not supported yet"),
        ("s3://b/ds", {"executor": "ray", "overwrite": True}, "Delete the output prefix"),
        ("s3://b/ds", {"layout": "tree", "overwrite": True}, "Delete the output prefix"),
        ("s3://b/ds", {"num_nodes": 2, "overwrite": True}, "Delete the output prefix"),
        ("https://host/ds", {}, "read-only"),
        ("s3://b", {}, "bucket root"),
    ],
)
def test_remote_outputs_still_refused(output, options, match, tmp_path):
    with pytest.raises(ConfigError, match=match):
        TokenizeConfig(input_dir=tmp_path, output_dir=output, **options)  # pyright: ignore[reportArgumentType]


def test_cli_tokenize_to_s3(seaweed, corpus, tiny_tokenizer, tmp_path):
    url = _url(seaweed)
    env = s3_cli_env(seaweed, tmp_path / "cache")
    args = ["--input-dir", str(corpus), "--output-dir", url, "--tokenizer", str(tiny_tokenizer), "--num-workers", "1"]
    command = [str(Path(sys.executable).with_name("tokenloom")), "tokenize", *args]
    command += ["--no-progress", "--shard-size-tokens", "3000"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"wrote {url}" in done.stdout
    assert S3_SECRET not in done.stdout + done.stderr
    local = _local(corpus, tiny_tokenizer, tmp_path / "local", shard_size_tokens=3000)
    same_dataset(local, seaweed.objects(url))


def test_faults_on_every_method_of_a_bucket_output_are_retried(
    seaweed, fault_proxy, corpus, tiny_tokenizer, tmp_path, monkeypatch
):
    """Reads too (the plan's probe, listings, the done markers' checks), not only uploads: the local bytes."""
    # eight faults may all land on one request: its backoff may pass the tests' 15 s budget on a loaded machine
    monkeypatch.setenv("TOKENLOOM_RETRY_BUDGET", "120")
    local = _local(corpus, tiny_tokenizer, tmp_path / "local", **OPTIONS)
    url = _url(seaweed)
    fault_proxy.fault_methods = {"PUT", "POST", "GET", "HEAD", "DELETE"}
    fault_proxy.faults = ["503", "reset", "503", "503", "reset", "503", "503", "reset"]
    tokenize(
        _bucket_config(
            corpus, url, tiny_tokenizer, seaweed.storage_options(fault_proxy.url), tmp_path / "cache", **OPTIONS
        )
    )
    assert fault_proxy.faults == []
    same_dataset(local, seaweed.objects(url))
