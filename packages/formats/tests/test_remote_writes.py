"""Writes to object storage, and gs:// / az://, against real servers (SeaweedFS, fake-gcs-server, Azurite)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from formats_helpers import open_cached

from tokenloom.formats import RemoteOptions, open_dataset, open_writer
from tokenloom.formats.errors import ConfigError, MissingFileError, StorageError
from tokenloom.formats.io import file_checksum, parse_url
from tokenloom.formats.remote import helper
from tokenloom.formats.remote.publish import RemoteTarget, check_apart, staging_dir, writable_url


def _write_native(root: Path, *, seed: int = 0, docs: int = 300) -> Path:
    rng = np.random.default_rng(seed)
    with open_writer(root, format="native", dtype="uint16", vocab_size=50_000, eos_id=0, shard_size_tokens=20_000) as w:
        for _ in range(docs):
            w.add(np.append(rng.integers(1, 50_000, size=int(rng.integers(5, 400)), dtype=np.uint16), np.uint16(0)))
    return root


def _entries(ds) -> list[bytes]:
    return [np.asarray(ds[i]).tobytes() for i in range(len(ds))]


def _prefix() -> str:
    return f"ds-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def local_ds(tmp_path: Path) -> Path:
    return _write_native(tmp_path / "local")


def test_native_dataset_from_gs_equals_local(fake_gcs, local_ds, tmp_path):
    url = fake_gcs.upload_dir(local_ds, _prefix())
    remote = open_cached(url, fake_gcs.storage_options(), tmp_path / "cache", 4096)
    assert len(remote) == len(open_dataset(local_ds)) > 0
    assert _entries(remote) == _entries(open_dataset(local_ds))


def test_native_dataset_from_az_equals_local(azurite, local_ds, tmp_path):
    url = azurite.upload_dir(local_ds, _prefix())
    remote = open_cached(url, azurite.storage_options(), tmp_path / "cache", 4096)
    assert _entries(remote) == _entries(open_dataset(local_ds))


def test_az_upload_is_skipped_when_already_there(azurite, tmp_path):
    url = parse_url(f"az://{azurite.container}/{_prefix()}")
    target = RemoteTarget(
        url, RemoteOptions.from_keywords(storage_options=azurite.storage_options()), part_size=5 << 20
    )
    big = tmp_path / "big.bin"
    big.write_bytes(np.random.default_rng(1).bytes(11 << 20))  # three parts
    assert target.upload(big) is True
    assert target.upload(big) is False  # same size and checksum: not put again
    there = helper.stat(target.config, "big.bin")
    assert there is not None and there["size"] == 11 << 20 and there["checksum"] == file_checksum(big)
    big.write_bytes(np.random.default_rng(2).bytes(11 << 20))
    assert target.upload(big) is True  # other bytes: uploaded again


def test_multipart_upload_retries_503_and_is_not_repeated(seaweed, fault_proxy, tmp_path):
    url = parse_url(f"s3://{seaweed.bucket}/{_prefix()}")
    target = RemoteTarget(
        url, RemoteOptions.from_keywords(storage_options=seaweed.storage_options(fault_proxy.url)), part_size=5 << 20
    )
    big = tmp_path / "shard_00000.bin"
    big.write_bytes(np.random.default_rng(3).bytes(12 << 20))
    fault_proxy.fault_methods = {"PUT", "POST"}
    fault_proxy.faults = ["503", "503", "503"]
    assert target.upload(big) is True
    assert fault_proxy.injected["503"] == 3
    key = f"/{seaweed.bucket}/{url.prefix}/shard_00000.bin"
    assert fault_proxy.uploads[key] == 1  # one completed multipart upload
    assert target.upload(big) is False and fault_proxy.uploads[key] == 1
    obj = helper.head(target.config, "shard_00000.bin")
    copy = tmp_path / "copy"
    helper.fetch_into(target.config, obj, 0, obj.size, copy)
    assert copy.read_bytes() == big.read_bytes()


def test_upload_failing_every_time_is_a_named_error(seaweed, fault_proxy, tmp_path):
    from tokenloom.formats.remote.client import RetryPolicy

    url = parse_url(f"s3://{seaweed.bucket}/{_prefix()}")
    target = RemoteTarget(
        url,
        RemoteOptions.from_keywords(
            storage_options=seaweed.storage_options(fault_proxy.url), retries=RetryPolicy(max_retries=2, backoff=0.01)
        ),
    )
    small = tmp_path / "x.bin"
    small.write_bytes(b"abc")
    fault_proxy.fault_methods = {"PUT"}
    fault_proxy.faults = ["503"] * 3
    with pytest.raises(StorageError, match="failed 3 times while uploading") as info:
        target.upload(small)
    assert "tokenloom-test-SECRET" not in str(info.value)


def test_missing_bucket_is_named_on_write(seaweed, tmp_path):
    target = RemoteTarget(
        parse_url("s3://no-such-bucket-w3/ds"), RemoteOptions.from_keywords(storage_options=seaweed.storage_options())
    )
    with pytest.raises(MissingFileError, match="no-such-bucket-w3"):
        target.existing()


@pytest.mark.parametrize(("url", "match"), [("https://host/ds", "read-only"), ("s3://bucket", "bucket root")])
def test_unwritable_urls(url, match):
    with pytest.raises(ConfigError, match=match):
        writable_url(url, "output")


def test_target_apart_from_source():
    target = parse_url("s3://b/data/out")
    check_apart(target, ["s3://b/data/in", "s3://other/data/out", "/local/path"], "the target")
    for source in ("s3://b/data/out", "s3://b/data", "s3://b/data/out/sub"):
        with pytest.raises(ConfigError, match="overlaps the source"):
            check_apart(target, [source], "the target")


def test_staging_dir_is_keyed_by_url_and_key(tmp_path):
    a = staging_dir(parse_url("s3://b/x"), {"k": 1}, tmp_path)
    assert a == staging_dir(parse_url("s3://b/x"), {"k": 1}, tmp_path)
    assert a != staging_dir(parse_url("s3://b/x"), {"k": 2}, tmp_path)
    assert a.parent != staging_dir(parse_url("s3://b/y"), {"k": 1}, tmp_path).parent
    assert a.is_relative_to(tmp_path / "uploads")


# -- convert SRC s3://... ----------------------------------------------------------------------------------------


def _local_files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}


@pytest.mark.parametrize(("to", "name"), [("native", ""), ("flat", ""), ("megatron", "data"), ("packed", "d.pbin")])
def test_convert_to_s3_equals_local_convert(seaweed, local_ds, tmp_path, to, name):
    from tokenloom.formats import convert_dataset

    local = tmp_path / "converted"
    local.mkdir()
    convert_dataset(local_ds, local / (name or "ds"), to=to)
    prefix = _prefix()
    url = f"s3://{seaweed.bucket}/{prefix}" + (f"/{name}" if name else "")
    target: dict[str, Any] = {"target_remote": RemoteOptions.from_keywords(storage_options=seaweed.storage_options())}
    convert_dataset(local_ds, url, to=to, target_plan_cache_dir=tmp_path, **target)
    expected = _local_files(local / "ds") if not name else _local_files(local)
    assert seaweed.objects(f"s3://{seaweed.bucket}/{prefix}") == expected
    assert not any((tmp_path / "uploads").rglob("*.bin")), "the staging directory is removed after the upload"
    if to == "native":
        remote = open_dataset(
            url,
            remote=RemoteOptions.from_keywords(
                storage_options=seaweed.storage_options(), block_cache_dir=tmp_path / "rc"
            ),
        )
        assert _entries(remote) == _entries(open_dataset(local_ds))
    with pytest.raises(ConfigError, match="already holds a dataset"):
        convert_dataset(local_ds, url, to=to, target_plan_cache_dir=tmp_path, **target)


def test_convert_to_s3_overwrite_and_overlap(seaweed, tmp_path):
    from tokenloom.formats import convert_dataset

    first, second = _write_native(tmp_path / "a", seed=1, docs=600), _write_native(tmp_path / "b", seed=2, docs=100)
    url = f"s3://{seaweed.bucket}/{_prefix()}"
    opts = {
        "target_remote": RemoteOptions.from_keywords(storage_options=seaweed.storage_options()),
        "target_plan_cache_dir": tmp_path,
    }
    convert_dataset(first, url, to="native", writer_options={"shard_size_tokens": 20_000}, **opts)
    assert sum(name.startswith("shard_") for name in seaweed.objects(url)) > 2
    convert_dataset(second, url, to="native", writer_options={"overwrite": True}, **opts)
    converted = tmp_path / "b-copy"
    convert_dataset(second, converted, to="native")
    assert seaweed.objects(url) == _local_files(converted)  # the first dataset's extra shards are gone
    assert _local_files(first)  # the source of an overwrite is never touched
    with pytest.raises(ConfigError, match="overlaps the source"):
        convert_dataset(url, f"{url}/inner", to="native", **opts)


CONVERT_SCRIPT = """
import json, sys
from tokenloom.formats import RemoteOptions, convert_dataset
remote = RemoteOptions.from_keywords(storage_options=json.loads(sys.argv[3]))
convert_dataset(sys.argv[1], sys.argv[2], to="native", target_remote=remote,
                target_plan_cache_dir=sys.argv[4])
"""


def test_convert_killed_before_manifest_resumes_the_upload(seaweed, fault_proxy, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time

    import orjson

    from tokenloom.formats import convert_dataset

    source = _write_native(tmp_path / "src", seed=4, docs=600)
    url = f"s3://{seaweed.bucket}/{_prefix()}"
    gate = threading.Event()
    fault_proxy.hold = {f"PUT /{url[5:]}/manifest.json": gate}
    options = orjson.dumps(seaweed.storage_options(fault_proxy.url)).decode()
    proc = subprocess.Popen(
        [sys.executable, "-c", CONVERT_SCRIPT, str(source), url, options, str(tmp_path / "cache")],
        start_new_session=True,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not fault_proxy.in_flight or not any("shard_" in p for p in fault_proxy.uploads):
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    _wait_group_gone(proc.pid)  # the helper too: a request it had in flight is then known to be dead
    gate.set()
    fault_proxy.wait_idle()
    assert "manifest.json" not in seaweed.objects(url)
    convert_dataset(
        source, url, to="native",
        target_remote=RemoteOptions.from_keywords(storage_options=seaweed.storage_options(fault_proxy.url)),
        target_plan_cache_dir=tmp_path / "cache",
    )  # fmt: skip
    assert {path: n for path, n in fault_proxy.uploads.items() if n != 1} == {}
    remote = open_dataset(
        url,
        remote=RemoteOptions.from_keywords(storage_options=seaweed.storage_options(), block_cache_dir=tmp_path / "rc"),
    )
    assert _entries(remote) == _entries(open_dataset(source))


def test_cli_convert_to_s3(seaweed, local_ds, tmp_path):
    import os
    import subprocess
    import sys

    from tokenloom.testing.servers import S3_SECRET

    url = f"s3://{seaweed.bucket}/{_prefix()}"
    env = {**os.environ, **seaweed.shell_env(), "TOKENLOOM_CACHE_DIR": str(tmp_path / "cache")}
    command = [str(Path(sys.executable).with_name("tokenloom")), "convert", str(local_ds), url, "--to", "native"]
    done = subprocess.run([*command, "--no-progress"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert S3_SECRET not in done.stdout + done.stderr
    remote = open_dataset(
        url,
        remote=RemoteOptions.from_keywords(storage_options=seaweed.storage_options(), block_cache_dir=tmp_path / "rc"),
    )
    assert _entries(remote) == _entries(open_dataset(local_ds))
    again = subprocess.run([*command, "--no-progress"], env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode != 0 and "already holds a dataset" in again.stderr + again.stdout


def _wait_group_gone(group: int, timeout: float = 10.0) -> None:
    import os
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    raise AssertionError(f"process group {group} still alive {timeout} s after SIGKILL")
