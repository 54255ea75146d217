"""Review of issue 36's remote folds: read_blocks as the one byte-range copy under BlockFile (ObjectFile), an
object changed between open and read, partial blocks at object ends, zero-length objects; and damaged local
native manifests and shards (named errors, never garbage)."""

from __future__ import annotations

import io
import os
import uuid
from pathlib import Path

import numpy as np
import pytest
from formats_helpers import cached_remote

from tokenloom.formats import open_dataset, open_writer
from tokenloom.formats.errors import DataError
from tokenloom.formats.remote.blockfile import BlockFile
from tokenloom.formats.remote.cache import BlockCache
from tokenloom.formats.remote.client import head

BLOCK = 4096


def _open(seaweed, tmp_path: Path, name: str, data: bytes) -> tuple[BlockFile, str]:
    prefix = f"review-{uuid.uuid4().hex[:8]}"
    seaweed.put(f"{prefix}/{name}", data)
    url = f"s3://{seaweed.bucket}/{prefix}"
    options = cached_remote(seaweed.storage_options(), tmp_path / "cache", block_size=BLOCK)
    cache = BlockCache.of(url, options)
    return BlockFile(cache, head(cache.config, name)), prefix


def test_blockfile_reads_across_and_at_the_end_of_partial_blocks(seaweed, tmp_path: Path) -> None:
    data = np.random.default_rng(3).integers(0, 256, size=3 * BLOCK + 123, dtype=np.uint8).tobytes()
    file, _ = _open(seaweed, tmp_path, "obj.bin", data)
    assert file.size == len(data)
    for start, count in [(0, 10), (BLOCK - 5, 10), (2 * BLOCK - 1, BLOCK + 2), (3 * BLOCK, 123), (len(data) - 7, 50)]:
        file.seek(start)
        assert file.read(count) == data[start : start + count], (start, count)
        assert file.tell() == min(len(data), start + count)
    file.seek(-3, os.SEEK_END)
    assert file.read() == data[-3:]
    assert file.read(10) == b""  # at the end: empty, not an error or stale bytes
    file.seek(len(data) + 100)
    assert file.read(10) == b""
    file.seek(0)
    assert io.BufferedReader(file, buffer_size=1000).read() == data
    with pytest.raises(OSError, match="negative seek"):
        file.seek(-1)


def test_a_zero_length_object_reads_as_empty(seaweed, tmp_path: Path) -> None:
    file, _ = _open(seaweed, tmp_path, "empty.bin", b"")
    assert file.size == 0
    assert file.read() == b"" and file.read(5) == b""
    file.seek(0, os.SEEK_END)
    assert file.tell() == 0 and file.read(1) == b""


def test_an_object_changed_between_open_and_read_is_a_named_error(seaweed, tmp_path: Path) -> None:
    data = b"a" * (2 * BLOCK + 10)
    file, prefix = _open(seaweed, tmp_path, "obj.bin", data)
    assert file.read(5) == b"aaaaa"  # block 0 cached under the old ETag
    seaweed.put(f"{prefix}/obj.bin", b"b" * len(data))  # the same size, another ETag
    file.seek(BLOCK + 1)
    with pytest.raises(DataError) as caught:
        file.read(10)  # block 1: fetched If-Match the old ETag
    assert type(caught.value).__name__ == "ResumeMismatchError"
    assert "changed since it was opened" in str(caught.value) and "obj.bin" in str(caught.value)


@pytest.fixture
def native(tmp_path: Path) -> Path:
    root = tmp_path / "native"
    rng = np.random.default_rng(7)
    with open_writer(root, format="native", dtype="uint16", vocab_size=1000, eos_id=0) as writer:
        for _ in range(50):
            writer.add(np.append(rng.integers(1, 1000, size=int(rng.integers(5, 200))), 0))
    return root


def _shard(root: Path) -> Path:
    return sorted(root.glob("shard_*.bin"))[0]


@pytest.mark.parametrize("cut", [0, 1, 17, -1])
def test_a_truncated_manifest_is_a_named_error(native: Path, cut: int) -> None:
    manifest = native / "manifest.json"
    data = manifest.read_bytes()
    manifest.write_bytes(data[:cut] if cut >= 0 else data[: len(data) // 2])
    with pytest.raises(DataError) as caught:
        open_dataset(native)
    assert "manifest.json" in str(caught.value)


def test_a_manifest_with_a_wrong_shard_size_is_a_named_error(native: Path) -> None:
    manifest = native / "manifest.json"
    text = manifest.read_text()
    size = _shard(native).stat().st_size
    assert f"{size}" in text
    manifest.write_text(text.replace(f"{size}", f"{size + 2}", 1))
    with pytest.raises(DataError):
        ds = open_dataset(native)
        [np.asarray(ds[i]) for i in range(len(ds))]


@pytest.mark.parametrize("remove", [1, 2, 1000])
def test_a_truncated_shard_is_a_named_error(native: Path, remove: int) -> None:
    shard = _shard(native)
    data = shard.read_bytes()
    shard.write_bytes(data[: max(0, len(data) - remove)])
    with pytest.raises(DataError) as caught:
        ds = open_dataset(native)
        [np.asarray(ds[i]) for i in range(len(ds))]
    assert shard.name in str(caught.value)


def test_a_bit_flipped_shard_is_caught_by_verify(native: Path) -> None:
    shard = _shard(native)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError) as caught:
        open_dataset(native, validate="deep")
    assert shard.name in str(caught.value)


def test_a_remote_dataset_read_by_small_blocks_equals_the_local_one(seaweed, native: Path, tmp_path: Path) -> None:
    """Every entry through 4 KiB blocks (entries across block ends, a short last block) is the local entry."""
    url = seaweed.upload_dir(native, f"review-{uuid.uuid4().hex[:8]}")
    ds = open_dataset(url, remote=cached_remote(seaweed.storage_options(), tmp_path / "c", block_size=BLOCK))
    local = open_dataset(native)
    assert len(ds) == len(local)
    assert [np.asarray(ds[i]).tobytes() for i in range(len(ds))] == [
        np.asarray(local[i]).tobytes() for i in range(len(local))
    ]


@pytest.mark.parametrize("keep", [0, 100])
def test_a_remote_shard_shorter_than_its_manifest_is_a_named_error(
    seaweed, native: Path, tmp_path: Path, keep: int
) -> None:
    prefix = f"review-{uuid.uuid4().hex[:8]}"
    url = seaweed.upload_dir(native, prefix)
    shard = _shard(native)
    seaweed.put(f"{prefix}/{shard.name}", shard.read_bytes()[:keep])
    with pytest.raises(DataError) as caught:
        ds = open_dataset(url, remote=cached_remote(seaweed.storage_options(), tmp_path / "c", block_size=BLOCK))
        [np.asarray(ds[i]) for i in range(len(ds))]
    assert shard.name in str(caught.value)
