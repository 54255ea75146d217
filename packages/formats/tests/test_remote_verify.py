"""Every byte read from a bucket is verified: block hashes in the manifest, checked at fetch and at first map.

Real SeaweedFS behind the fault proxy ("flip": one body byte inverted, the length right), and cache files
corrupted on disk. Cache blocks of 1 MiB here: a multiple of the manifest's 1 MiB hash block.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from click.testing import CliRunner
from formats_helpers import MIB, cached_remote, entry_bytes, open_cached, warnings_with

from tokenloom.formats import RemoteOptions, open_dataset, open_writer
from tokenloom.formats.cli.commands import validate
from tokenloom.formats.errors import ChecksumError, FormatError
from tokenloom.formats.io import HASH_BLOCK_SIZE, file_digests
from tokenloom.formats.io.manifest import read_manifest, write_manifest

LOGGER = "tokenloom.formats.remote"


def _write(root: Path, fmt: str = "native") -> Path:
    rng = np.random.default_rng(3)
    with open_writer(root, format=fmt, dtype="uint16", vocab_size=50_000, eos_id=0) as writer:
        for _ in range(6):  # about 3 MiB of tokens: three 1 MiB blocks of one .bin
            writer.add(np.append(rng.integers(1, 50_000, size=260_000, dtype=np.int64), 0))
    return root


@pytest.fixture(scope="module")
def local_ds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("verify") / "local")


def _upload(seaweed, local: Path) -> str:
    return seaweed.upload_dir(local, f"verify-{uuid.uuid4().hex[:8]}")


def _without_block_hashes(local: Path, target: Path) -> Path:
    """A copy whose manifest is as written before block hashes (same files, same checksums)."""
    shutil.copytree(local, target)
    manifest = read_manifest(target)
    files = tuple(dataclasses.replace(f, blocks=None) for f in manifest.files)
    write_manifest(target, dataclasses.replace(manifest, files=files, checksum=""))
    return target


# -- the manifest records them ---------------------------------------------------------------------


def test_the_writer_records_a_hash_per_block_of_each_data_file(local_ds):
    manifest = read_manifest(local_ds)
    (data,) = [f for f in manifest.files if f.role == "data"]
    assert data.blocks is not None and data.blocks.block_size == HASH_BLOCK_SIZE
    assert len(data.blocks) == -(-data.bytes // HASH_BLOCK_SIZE) >= 3
    raw = (local_ds / data.name).read_bytes()
    assert data.blocks == file_digests(local_ds / data.name)[1]
    assert data.blocks.mismatch(raw[MIB : 2 * MIB], MIB) is None
    flipped = bytearray(raw[MIB : 2 * MIB])
    flipped[5] ^= 0xFF
    assert data.blocks.mismatch(flipped, MIB) is not None
    assert all(f.blocks is not None for f in manifest.files if f.role == "index")  # read by block on first touch


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"block_size": 1000}, "files.block_size"),
        ({"block_xxh3_64": "00"}, "files.block_xxh3_64"),
        ({"block_xxh3_64": None}, "files.block_xxh3_64"),
    ],
)
def test_malformed_block_hashes_are_a_format_error(local_ds, tmp_path, change, field):
    target = tmp_path / "ds"
    shutil.copytree(local_ds, target)
    payload = orjson.loads((target / "manifest.json").read_bytes())
    payload.pop("checksum")
    data = next(f for f in payload["files"] if f["role"] == "data")
    data.update(change)
    import xxhash

    payload["checksum"] = xxhash.xxh3_128(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)).hexdigest()
    (target / "manifest.json").write_bytes(orjson.dumps(payload, option=orjson.OPT_INDENT_2))
    with pytest.raises(FormatError) as caught:
        open_dataset(target)
    assert caught.value.field == field and "manifest.json" in str(caught.value)


def test_an_old_manifest_opens_locally_with_the_same_fingerprint(local_ds, tmp_path):
    old = _without_block_hashes(local_ds, tmp_path / "old")
    assert open_dataset(old).fingerprint == open_dataset(local_ds).fingerprint
    assert entry_bytes(open_dataset(old)) == entry_bytes(open_dataset(local_ds))


def test_validate_write_manifest_adds_block_hashes(local_ds, tmp_path):
    old = _without_block_hashes(local_ds, tmp_path / "old")
    before = open_dataset(old).fingerprint
    result = CliRunner().invoke(validate, [str(old), "--write-manifest"])
    assert result.exit_code == 0, result.output
    assert "added block hashes of 2 files" in result.output  # the .bin's and (since the open by blocks) the .idx's
    assert read_manifest(old).files == read_manifest(local_ds).files
    assert open_dataset(old).fingerprint == before  # a saved state still resumes
    again = CliRunner().invoke(validate, [str(old), "--write-manifest"])
    assert again.exit_code == 0 and "block hashes already recorded" in again.output
    # damaged data is never blessed with hashes
    damaged = _without_block_hashes(local_ds, tmp_path / "damaged")
    data = damaged / "shard_00000.bin"
    raw = bytearray(data.read_bytes())
    raw[MIB + 7] ^= 0xFF
    data.write_bytes(bytes(raw))
    bad = CliRunner().invoke(validate, [str(damaged), "--write-manifest"])
    assert bad.exit_code == 1 and "ChecksumError" in bad.output and "shard_00000.bin" in bad.output
    assert read_manifest(damaged).files[1].blocks is None


# -- verified at fetch ---------------------------------------------------------------------------


def test_a_flipped_byte_on_the_wire_is_fetched_again(seaweed, fault_proxy, local_ds, tmp_path, caplog):
    url = _upload(seaweed, local_ds)
    expected = entry_bytes(open_dataset(local_ds))
    fault_proxy.fault_paths = ".bin"
    fault_proxy.faults = ["flip"]
    options = seaweed.storage_options(endpoint=fault_proxy.url)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        ds = open_cached(url, options, tmp_path / "c")  # validate="fast"
        assert entry_bytes(ds) == expected
    assert fault_proxy.injected["flip"] == 1
    assert len(warnings_with(caplog, "arrived with a wrong hash")) == 1
    # nothing wrong was cached: a fresh open from the same cache reads the right bytes with no GET
    gets = sum(fault_proxy.gets.values())
    assert entry_bytes(open_cached(url, options, tmp_path / "c")) == expected
    assert sum(fault_proxy.gets.values()) - gets <= 1  # the manifest's HEAD/list only, never a .bin block


def test_a_block_that_never_arrives_right_is_a_checksum_error(seaweed, fault_proxy, local_ds, tmp_path):
    url = _upload(seaweed, local_ds)
    fault_proxy.fault_paths = ".bin"
    fault_proxy.faults = ["flip"] * 10
    options = seaweed.storage_options(endpoint=fault_proxy.url)
    ds = open_cached(url, options, tmp_path / "c")
    with pytest.raises(ChecksumError) as caught:
        entry_bytes(ds)
    message = str(caught.value)
    digest = read_manifest(local_ds).files[1].blocks.digest(0)  # type: ignore[union-attr]
    assert f"{url}/shard_00000.bin" in message and "block 0 (bytes 0-1048576)" in message
    assert "fetched 3 times" in message and f"the manifest records {digest}" in message
    assert caught.value.field == "block_xxh3_64" and fault_proxy.injected["flip"] == 3
    idx_start = (local_ds / "shard_00000.idx").read_bytes()[:MIB]
    assert [p.read_bytes() == idx_start for p in (tmp_path / "c").rglob(f"b{MIB}-0")] == [True]  # .bin's: never


# -- verified at first map -----------------------------------------------------------------------


def _corrupt_one_cached_block(cache: Path, number: int = 1) -> Path:
    (block,) = list(cache.rglob(f"b{MIB}-{number}"))
    raw = bytearray(block.read_bytes())
    raw[12345] ^= 0x01
    block.write_bytes(bytes(raw))  # the same size: the cache's size check cannot see it
    return block


def test_a_corrupt_cached_block_is_discarded_and_fetched_again(seaweed, local_ds, tmp_path, caplog):
    url = _upload(seaweed, local_ds)
    expected = entry_bytes(open_dataset(local_ds))
    options = seaweed.storage_options()
    assert entry_bytes(open_cached(url, options, tmp_path / "c")) == expected
    block = _corrupt_one_cached_block(tmp_path / "c")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        ds = open_cached(url, options, tmp_path / "c")
        assert entry_bytes(ds) == expected
    (warning,) = warnings_with(caplog, "corrupt")
    assert str(block) in warning and "fetching it again" in warning
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):  # the next open is clean: the cache healed
        assert entry_bytes(open_cached(url, options, tmp_path / "c")) == expected
    assert not warnings_with(caplog, "")


def test_a_corrupt_cached_block_heals_under_a_cache_limit(seaweed, local_ds, tmp_path, caplog):
    url = _upload(seaweed, local_ds)
    expected = entry_bytes(open_dataset(local_ds))
    options: dict[str, Any] = {"remote": cached_remote(seaweed.storage_options(), tmp_path / "c")}
    assert (
        entry_bytes(
            open_dataset(url, remote=RemoteOptions.from_keywords(cache_limit="64MiB", remote=options["remote"]))
        )
        == expected
    )
    block = _corrupt_one_cached_block(tmp_path / "c", 2)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert (
            entry_bytes(
                open_dataset(url, remote=RemoteOptions.from_keywords(cache_limit="64MiB", remote=options["remote"]))
            )
            == expected
        )
    assert [w for w in warnings_with(caplog, "corrupt") if str(block) in w]


def test_deep_validation_heals_a_corrupt_cache_instead_of_blaming_the_bucket(seaweed, local_ds, tmp_path, caplog):
    """Without usable block hashes (4 KiB cache blocks), deep validation's whole-file checksum finds it."""
    url = _upload(seaweed, local_ds)
    options: dict[str, Any] = {"remote": cached_remote(seaweed.storage_options(), tmp_path / "c", 4096)}
    open_dataset(url, validate="deep", **options)
    (block,) = list((tmp_path / "c").rglob("b4096-300"))
    raw = bytearray(block.read_bytes())
    raw[10] ^= 0x01
    block.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        ds = open_dataset(url, validate="deep", **options)
    assert entry_bytes(ds) == entry_bytes(open_dataset(local_ds))
    assert warnings_with(caplog, "cached blocks were corrupt")
    open_dataset(url, validate="deep", **options)  # and the next deep open passes too


# -- what cannot be verified is said once ----------------------------------------------------------


def test_an_old_manifest_opens_and_says_once_that_it_is_unverified(seaweed, local_ds, tmp_path, caplog):
    url = _upload(seaweed, _without_block_hashes(local_ds, tmp_path / "old"))
    options: dict[str, Any] = {"remote": cached_remote(seaweed.storage_options(), tmp_path / "c")}
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        ds = open_dataset(url, **options)
        assert entry_bytes(ds) == entry_bytes(open_dataset(local_ds))
        open_dataset(url, **options)
    (said,) = warnings_with(caplog, "unverified")
    assert url in said and "1 of 1 data files have no block hashes" in said and "--write-manifest" in said


def test_a_cache_block_not_a_multiple_of_the_hash_block_is_said(seaweed, local_ds, tmp_path, caplog):
    url = _upload(seaweed, local_ds)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        open_dataset(
            url,
            remote=RemoteOptions.from_keywords(
                storage_options=seaweed.storage_options(), block_cache_dir=tmp_path / "c", block_size=64 << 10
            ),
        )
    (said,) = warnings_with(caplog, "unverified")
    assert "not a multiple of the manifest's hash block 1048576" in said


def test_foreign_formats_verify_what_a_manifest_records_and_say_the_rest(seaweed, fault_proxy, tmp_path, caplog):
    flat = _write(tmp_path / "flat", "flat")
    (tmp_path / "megatron").mkdir()
    megatron = _write(tmp_path / "megatron" / "part", "megatron").parent
    options: dict[str, Any] = {
        "remote": RemoteOptions.from_keywords(
            storage_options=seaweed.storage_options(endpoint=fault_proxy.url), block_size=MIB
        )
    }
    flat_url, megatron_url = _upload(seaweed, flat), _upload(seaweed, megatron)
    fault_proxy.fault_paths = ".npy"
    fault_proxy.faults = ["flip"]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        ds = open_dataset(
            flat_url, remote=RemoteOptions.from_keywords(block_cache_dir=tmp_path / "c1", remote=options["remote"])
        )
        assert entry_bytes(ds) == entry_bytes(open_dataset(flat))  # the flat manifest's hashes caught the flip
        assert fault_proxy.injected["flip"] == 1 and not warnings_with(caplog, "unverified")
        open_dataset(
            megatron_url, remote=RemoteOptions.from_keywords(block_cache_dir=tmp_path / "c2", remote=options["remote"])
        )
        open_dataset(
            megatron_url, remote=RemoteOptions.from_keywords(block_cache_dir=tmp_path / "c3", remote=options["remote"])
        )
    (said,) = warnings_with(caplog, "unverified")
    assert megatron_url in said


def test_a_corrupt_cached_index_of_a_foreign_format_is_fetched_again(seaweed, tmp_path, caplog):
    flat = _write(tmp_path / "flat", "flat")
    url = _upload(seaweed, flat)
    options: dict[str, Any] = {"remote": cached_remote(seaweed.storage_options(), tmp_path / "c")}
    expected = entry_bytes(open_dataset(flat))
    assert entry_bytes(open_dataset(url, **options)) == expected
    (cached,) = [p for p in (tmp_path / "c").rglob("b*-0") if p.stat().st_size == 48]  # document_lengths.i64
    raw = bytearray(cached.read_bytes())
    raw[9] ^= 0x01
    cached.write_bytes(bytes(raw))  # the cached block the flat reader reads (in place: same inode)
    shutil.rmtree(tmp_path / "c" / "index-v1")  # the offsets derived from it: else the block is not read again
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert entry_bytes(open_dataset(url, **options)) == expected
    assert [w for w in warnings_with(caplog, "corrupt") if str(cached) in w]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert entry_bytes(open_dataset(url, **options)) == expected
    assert not warnings_with(caplog, "")
