"""Review of issue 36's remote write folds: RemoteTarget without its own retries (the RemoteOptions' budget),
put_file as the one upload (plain, multipart, and create-once), stat/etag_of as the one ETag reader."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest

from tokenloom.formats import RemoteOptions
from tokenloom.formats.errors import DataError
from tokenloom.formats.io.manifest import file_checksum
from tokenloom.formats.io.urls import parse_url
from tokenloom.formats.remote import helper
from tokenloom.formats.remote.publish import RemoteTarget

MIB = 1 << 20


def _target(seaweed, part_size: int | None = None) -> RemoteTarget:
    url = parse_url(f"s3://{seaweed.bucket}/review-{uuid.uuid4().hex[:8]}")
    remote = RemoteOptions.from_keywords(storage_options=seaweed.storage_options())
    return RemoteTarget(url, remote) if part_size is None else RemoteTarget(url, remote, part_size=part_size)


def _object(seaweed, target: RemoteTarget, name: str) -> bytes:
    return seaweed.objects(str(target.url))[name]


def test_upload_skips_what_is_there_and_replaces_what_changed(seaweed, tmp_path: Path) -> None:
    target = _target(seaweed)
    path = tmp_path / "a.bin"
    path.write_bytes(b"x" * 1000)
    assert target.upload(path) is True
    assert target.upload(path) is False  # same size and checksum: skipped
    path.write_bytes(b"y" * 1000)  # same size, other bytes
    assert target.upload(path) is True
    assert _object(seaweed, target, "a.bin") == b"y" * 1000
    there = helper.stat(target.config, "a.bin")
    assert there is not None and there["size"] == 1000 and there["checksum"] == file_checksum(path)
    assert there["etag"]
    assert target.existing() == ["a.bin"]


def test_a_zero_length_file_uploads_and_stats(seaweed, tmp_path: Path) -> None:
    target = _target(seaweed)
    path = tmp_path / "empty.bin"
    path.write_bytes(b"")
    assert target.upload(path) is True and target.upload(path) is False
    there = helper.stat(target.config, "empty.bin")
    assert there is not None and there["size"] == 0
    assert _object(seaweed, target, "empty.bin") == b""


def test_a_multipart_upload_is_the_file(seaweed, tmp_path: Path) -> None:
    target = _target(seaweed, part_size=5 * MIB)
    path = tmp_path / "big.bin"
    data = np.random.default_rng(1).integers(0, 256, size=11 * MIB + 17, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    assert target.upload(path) is True
    assert _object(seaweed, target, "big.bin") == data
    assert target.upload(path) is False


def test_put_once_creates_once_and_never_overwrites(seaweed, tmp_path: Path) -> None:
    target = _target(seaweed)
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_bytes(b"first")
    second.write_bytes(b"second")
    assert helper.put_once(target.config, first, "lock.json", file_checksum(first)) is True
    assert helper.put_once(target.config, second, "lock.json", file_checksum(second)) is False
    assert _object(seaweed, target, "lock.json") == b"first"


def test_read_manifest_none_then_a_damaged_one_is_named(seaweed, tmp_path: Path) -> None:
    target = _target(seaweed)
    assert target.read_manifest() is None
    bad = tmp_path / "manifest.json"
    bad.write_bytes(b'{"manifest_version": 1, "files": [')
    target.upload(bad)
    with pytest.raises(DataError) as caught:
        target.read_manifest()
    assert "manifest" in str(caught.value)


def test_a_missing_bucket_is_named(seaweed) -> None:
    url = parse_url(f"s3://no-such-bucket-{uuid.uuid4().hex[:6]}/x")
    target = RemoteTarget(url, RemoteOptions.from_keywords(storage_options=seaweed.storage_options(), retries=0))
    with pytest.raises(DataError):
        target.existing()
