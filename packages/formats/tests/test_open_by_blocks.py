"""Open in constant time: a native index is checked by block when first touched, the whole of it only by deep."""

from __future__ import annotations

import pickle
import uuid
from pathlib import Path

import numpy as np
import pytest

from tokenloom.formats import RemoteOptions, open_dataset, open_writer
from tokenloom.formats.errors import ChecksumError, DataError, IndexCorruptError
from tokenloom.formats.io.manifest import read_manifest, write_manifest
from tokenloom.formats.native.layout import HEADER

DOCS = 400_000  # offsets of 3.2 MB: four 1 MiB hash blocks
FAR = 300_000  # a document whose offsets lie in the third hash block


def _write(root: Path) -> Path:
    with open_writer(root, format="native", dtype="uint16", vocab_size=1000, eos_id=0) as writer:
        for i in range(DOCS):
            writer.add(np.array([i % 998 + 1, 0], dtype=np.uint16))
    return root


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ 0x40]))


def test_a_far_index_block_flipped_opens_and_fails_when_touched(tmp_path: Path) -> None:
    root = _write(tmp_path / "ds")
    at = HEADER.size + 8 * (FAR + 1)
    _flip(root / "shard_00000.idx", at)
    ds = open_dataset(root)  # the default reads no index block but the header's and the last one
    assert ds[0].tolist() == [1, 0] and ds[DOCS - 1].tolist() == [(DOCS - 1) % 998 + 1, 0]
    with pytest.raises(ChecksumError) as caught:
        ds[FAR]
    error = caught.value
    assert isinstance(error, DataError)
    assert error.path is not None and error.path.endswith("shard_00000.idx")
    assert error.offset == at - at % (1 << 20)  # the start of the bad 1 MiB block
    assert "entries" in str(error) and "restore" in str(error)  # which documents, and what to do
    with pytest.raises(ChecksumError):
        ds[FAR]  # still bad on the next touch: never wrong data
    with pytest.raises(ChecksumError):
        ds.doc_lengths  # noqa: B018 - the whole index is every block
    with pytest.raises(ChecksumError, match="shard_00000.idx"):
        open_dataset(root, validate="deep")  # deep reads every byte at open


def test_blocks_are_checked_again_in_a_worker(tmp_path: Path) -> None:
    root = _write(tmp_path / "ds")
    ds = open_dataset(root)
    assert ds[FAR].tolist() == [FAR % 998 + 1, 0]
    _flip(root / "shard_00000.idx", HEADER.size + 8 * (FAR + 1))
    worker = pickle.loads(pickle.dumps(ds))  # a DataLoader worker: its own checks of what it touches
    with pytest.raises(ChecksumError):
        worker[FAR]


def test_a_block_whose_hash_matches_is_still_checked_for_structure(tmp_path: Path) -> None:
    root = _write(tmp_path / "ds")
    idx = root / "shard_00000.idx"
    offsets = np.memmap(idx, dtype="<i8", mode="r+", offset=HEADER.size, shape=(DOCS + 1,))
    offsets[FAR] = offsets[FAR + 2]  # a decrease: what a writer's bug would record, hashed as written
    offsets.flush()
    del offsets
    manifest = read_manifest(root)
    write_manifest(root, manifest.__class__(**{**_fields(manifest), "files": _rehashed(root, manifest)}))
    ds = open_dataset(root)
    with pytest.raises(IndexCorruptError) as caught:
        ds[FAR + 1]
    assert caught.value.record == FAR + 1 and caught.value.field == "offsets"


def _fields(manifest):
    return {name: getattr(manifest, name) for name in manifest.__dataclass_fields__ if name != "checksum"}


def _rehashed(root: Path, manifest):
    from tokenloom.formats.io.manifest import describe_file

    return tuple(describe_file(root, entry.name, entry.role) for entry in manifest.files)


def test_a_manifest_without_index_hashes_opens_as_before(tmp_path: Path) -> None:
    root = _write(tmp_path / "ds")
    manifest = read_manifest(root)
    import dataclasses

    files = tuple(dataclasses.replace(e, blocks=None) if e.role == "index" else e for e in manifest.files)
    write_manifest(root, dataclasses.replace(manifest, files=files, checksum=""))
    _flip(root / "shard_00000.idx", HEADER.size + 8 * (FAR + 1))
    with pytest.raises(ChecksumError):
        open_dataset(root)  # no block hashes: the whole index checksum at open, as before


def _remote(options, cache, block_size=None) -> RemoteOptions:
    return RemoteOptions.from_keywords(storage_options=options, block_cache_dir=cache, block_size=block_size)


def test_a_remote_index_is_fetched_by_blocks_and_checked_when_touched(seaweed, tmp_path: Path) -> None:
    local = _write(tmp_path / "local")
    good = seaweed.upload_dir(local, f"lazy-{uuid.uuid4().hex[:8]}")
    options = seaweed.storage_options()
    ds = open_dataset(good, remote=_remote(options, tmp_path / "cache", 1 << 20))
    assert ds[0].tolist() == [1, 0]
    cached = sum(p.stat().st_size for p in (tmp_path / "cache").rglob("b*-*") if p.is_file())
    assert cached < (local / "shard_00000.idx").stat().st_size  # the blocks one document touches, not the index
    assert ds[FAR].tolist() == [FAR % 998 + 1, 0]
    _flip(local / "shard_00000.idx", HEADER.size + 8 * (FAR + 1))
    bad = seaweed.upload_dir(local, f"lazy-bad-{uuid.uuid4().hex[:8]}")  # the good manifest's hashes, bad bytes
    ds = open_dataset(bad, remote=_remote(options, tmp_path / "cache2", 1 << 20))
    assert ds[0].tolist() == [1, 0]
    with pytest.raises(ChecksumError) as caught:
        ds[FAR]
    assert caught.value.path is not None and caught.value.path.startswith("s3://")
    with pytest.raises(ChecksumError):
        open_dataset(bad, remote=_remote(options, tmp_path / "cache3"), validate="deep")
