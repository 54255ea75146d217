"""Writes to object storage and the gs:// / az:// schemes, against real servers (SeaweedFS, fake-gcs-server, Azurite)."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest

from tokenloom.formats import open_dataset, open_writer
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
    remote = open_dataset(url, storage_options=fake_gcs.storage_options(), cache_dir=tmp_path / "cache", block_size=4096)
    assert len(remote) == len(open_dataset(local_ds)) > 0
    assert _entries(remote) == _entries(open_dataset(local_ds))


def test_native_dataset_from_az_equals_local(azurite, local_ds, tmp_path):
    url = azurite.upload_dir(local_ds, _prefix())
    remote = open_dataset(url, storage_options=azurite.storage_options(), cache_dir=tmp_path / "cache", block_size=4096)
    assert _entries(remote) == _entries(open_dataset(local_ds))


def test_az_upload_is_skipped_when_already_there(azurite, tmp_path):
    url = parse_url(f"az://{azurite.container}/{_prefix()}")
    target = RemoteTarget(url, azurite.storage_options(), part_size=5 << 20)
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
    target = RemoteTarget(url, seaweed.storage_options(fault_proxy.url), part_size=5 << 20)
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
    target = RemoteTarget(url, seaweed.storage_options(fault_proxy.url), RetryPolicy(max_retries=2, backoff=0.01))
    small = tmp_path / "x.bin"
    small.write_bytes(b"abc")
    fault_proxy.fault_methods = {"PUT"}
    fault_proxy.faults = ["503"] * 3
    with pytest.raises(StorageError, match="failed 3 times while uploading") as info:
        target.upload(small)
    assert "tokenloom-test-SECRET" not in str(info.value)


def test_missing_bucket_is_named_on_write(seaweed, tmp_path):
    target = RemoteTarget(parse_url("s3://no-such-bucket-w3/ds"), seaweed.storage_options())
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
