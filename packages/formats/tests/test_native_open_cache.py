"""Opening a native dataset again: one index-cache lookup for all shards, and every change still caught.

A fast open remembers, per version of the files, that the index checksums matched the manifest and that
the offsets passed; a reopen of the same versions asks the cache once for all index files and once for
all shard pairs (not once per shard). A changed file is another version, so it is checked again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from tokenloom.formats import ChecksumError, IndexCorruptError, TruncatedError, open_dataset, open_writer
from tokenloom.formats.io import MANIFEST_NAME, index_map, manifest
from tokenloom.formats.native import reader
from tokenloom.formats.native.layout import HEADER

SHARDS = 12


@pytest.fixture(autouse=True)
def settled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENLOOM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(index_map, "_SETTLE_NS", 0)  # files made a moment ago may be remembered


def write(root: Path, *, keep_manifest: bool = True) -> list[list[int]]:
    docs = [[k, k + 1, 0] for k in range(1, 3 * SHARDS + 1)]
    with open_writer(root, format="native", dtype="uint16", vocab_size=100, eos_id=0, shard_size_tokens=9) as writer:
        for doc in docs:
            writer.add(np.array(doc, dtype=np.int64))
    if not keep_manifest:
        (root / MANIFEST_NAME).unlink()
    assert len(list(root.glob("*.idx"))) == SHARDS
    return docs


def count_lookups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]

    def counting(*args, **kwargs):
        calls[0] += 1
        return index_map.checked_before(*args, **kwargs)

    monkeypatch.setattr(manifest, "checked_before", counting)
    monkeypatch.setattr(reader, "checked_before", counting)
    return calls


def edit(path: Path, offset: int, data: bytes) -> None:
    time.sleep(0.05)  # a later timestamp than the cached open saw, as any real edit has
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)


def _write_and_open_twice(root: Path, *, keep_manifest: bool = True) -> None:
    """Write the dataset, then open it twice: the second open is served by the open cache."""
    write(root, keep_manifest=keep_manifest)
    open_dataset(root)
    open_dataset(root)


@pytest.mark.parametrize("keep_manifest", [True, False], ids=["manifest", "gpt-simple"])
def test_a_reopen_asks_the_index_cache_a_fixed_number_of_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep_manifest: bool
) -> None:
    docs = write(tmp_path / "ds", keep_manifest=keep_manifest)
    first = open_dataset(tmp_path / "ds")
    calls = count_lookups(monkeypatch)
    scans = []
    monkeypatch.setattr(reader, "validate_offsets", lambda *args, **kwargs: scans.append(args))
    again = open_dataset(tmp_path / "ds")
    # with index block hashes nothing is looked up (the blocks a read touches are checked then); without a
    # manifest: all offsets at once, not once per shard
    assert calls[0] == (0 if keep_manifest else 1)
    assert scans == []
    assert [again[i].tolist() for i in range(len(docs))] == docs
    assert again.fingerprint == first.fingerprint


def test_an_index_changed_after_a_cached_open_fails_its_checksum(tmp_path: Path) -> None:
    _write_and_open_twice(tmp_path / "ds")
    victim = sorted((tmp_path / "ds").glob("*.idx"))[5]
    edit(victim, HEADER.size + 8, np.array([2], "<i8").tobytes())  # same size, other bytes
    with pytest.raises(ChecksumError) as caught:
        open_dataset(tmp_path / "ds")
    assert caught.value.path == os.fspath(victim)


def test_bad_offsets_written_after_a_cached_open_are_caught_without_a_manifest(tmp_path: Path) -> None:
    _write_and_open_twice(tmp_path / "ds", keep_manifest=False)
    victim = sorted((tmp_path / "ds").glob("*.idx"))[7]
    edit(victim, HEADER.size + 8 * 2, np.array([1], "<i8").tobytes())  # offsets 0, 3, 1, 9: a decrease
    with pytest.raises(IndexCorruptError, match="decrease") as caught:
        open_dataset(tmp_path / "ds")
    assert caught.value.path == os.fspath(victim)


def test_a_data_file_cut_short_after_a_cached_open_is_caught_without_a_manifest(tmp_path: Path) -> None:
    _write_and_open_twice(tmp_path / "ds", keep_manifest=False)
    victim = sorted((tmp_path / "ds").glob("*.bin"))[3]
    time.sleep(0.05)
    os.truncate(victim, victim.stat().st_size - 2)
    with pytest.raises(TruncatedError):
        open_dataset(tmp_path / "ds")


def test_deep_validation_reads_every_index_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "ds")
    open_dataset(tmp_path / "ds")
    scans = []
    checking = reader.validate_offsets
    monkeypatch.setattr(reader, "validate_offsets", lambda *args, **kwargs: scans.append(checking(*args, **kwargs)))
    open_dataset(tmp_path / "ds", validate="deep")
    assert len(scans) == SHARDS
