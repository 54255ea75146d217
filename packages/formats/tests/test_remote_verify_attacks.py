"""Review attacks on verified bytes (issue 35 item 1): block sizes, the last short block, the manifest itself."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from formats_helpers import MIB, cached_remote, entry_bytes, open_cached, warnings_with

from tokenloom.formats import RemoteOptions, open_dataset, open_writer
from tokenloom.formats.errors import ChecksumError, DataError, FormatError

LOGGER = "tokenloom.formats.remote"


@pytest.fixture(scope="module")
def big_ds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One .bin of about 10.5 MiB: an 8 MiB cache block and a short last one, a short last hash block."""
    root = tmp_path_factory.mktemp("attack") / "local"
    rng = np.random.default_rng(5)
    with open_writer(root, format="native", dtype="uint16", vocab_size=50_000, eos_id=0) as writer:
        for _ in range(11):
            writer.add(np.append(rng.integers(1, 50_000, size=500_000, dtype=np.int64), 0))
    return root


@pytest.mark.parametrize(("block_size", "where"), [(8 * MIB, "last"), (3 * MIB, "first"), (2 * MIB, "last")])
def test_a_flip_is_caught_at_aligned_block_sizes(seaweed, fault_proxy, big_ds, tmp_path, caplog, block_size, where):
    """The default 8 MiB, 3 MiB (hash blocks 3k..3k+2) and the file's short last cache and hash block."""
    url = seaweed.upload_dir(big_ds, f"attack-{uuid.uuid4().hex[:8]}")
    local = open_dataset(big_ds)
    index = 0 if where == "first" else len(local) - 1
    fault_proxy.fault_paths = ".bin"
    fault_proxy.faults = ["flip"]
    options = seaweed.storage_options(endpoint=fault_proxy.url)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        ds = open_dataset(
            url,
            remote=RemoteOptions.from_keywords(
                storage_options=options, block_cache_dir=tmp_path / "c", block_size=block_size
            ),
        )
        assert np.asarray(ds[index]).tobytes() == np.asarray(local[index]).tobytes()
    assert fault_proxy.injected["flip"] == 1
    assert len(warnings_with(caplog, "arrived with a wrong hash")) == 1
    assert not warnings_with(caplog, "unverified")


def test_a_flip_in_the_index_on_the_wire_is_fetched_again(seaweed, fault_proxy, big_ds, tmp_path):
    url = seaweed.upload_dir(big_ds, f"attack-{uuid.uuid4().hex[:8]}")
    fault_proxy.fault_paths = ".idx"
    fault_proxy.faults = ["flip"]
    options = seaweed.storage_options(endpoint=fault_proxy.url)
    ds = open_cached(url, options, tmp_path / "c")
    assert entry_bytes(ds) == entry_bytes(open_dataset(big_ds))
    assert fault_proxy.injected["flip"] == 1


def test_a_flip_in_the_manifest_on_the_wire_does_not_poison_the_cache(seaweed, fault_proxy, big_ds, tmp_path, caplog):
    """The flipped copy is caught before it is published to the node cache: no other process sharing the cache
    (ranks, workers) meets it, so one flip costs one fetch in one process (not a discard in each reader)."""
    url = seaweed.upload_dir(big_ds, f"attack-{uuid.uuid4().hex[:8]}")
    fault_proxy.fault_paths = "manifest.json"
    fault_proxy.faults = ["flip"]
    remote = RemoteOptions.from_keywords(
        storage_options=seaweed.storage_options(endpoint=fault_proxy.url),
        block_cache_dir=tmp_path / "c",
        block_size=MIB,
    )
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert entry_bytes(open_dataset(url, remote=remote)) == entry_bytes(open_dataset(big_ds))
    assert fault_proxy.injected["flip"] == 1
    (caught,) = warnings_with(caplog, "arrived with a wrong hash")
    assert "manifest.json: the object arrived" in caught
    assert not warnings_with(caplog, "the cached manifest")  # never published, so never discarded from the cache


def test_a_misaligned_block_size_is_said_once_and_reads_right(seaweed, big_ds, tmp_path, caplog):
    block_size = 1536 << 10  # 1.5 MiB: covers some hash blocks whole, but not all
    url = seaweed.upload_dir(big_ds, f"attack-{uuid.uuid4().hex[:8]}")
    options: dict[str, Any] = {
        "remote": RemoteOptions.from_keywords(
            storage_options=seaweed.storage_options(), block_cache_dir=tmp_path / "c", block_size=block_size
        )
    }
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        ds = open_dataset(url, **options)
        assert entry_bytes(ds) == entry_bytes(open_dataset(big_ds))
    (said,) = warnings_with(caplog, "unverified")
    assert str(block_size) in said and "1 MiB" in said


def test_a_shard_replaced_in_the_bucket_under_a_reader(seaweed, big_ds, tmp_path):
    prefix = f"attack-{uuid.uuid4().hex[:8]}"
    url = seaweed.upload_dir(big_ds, prefix)
    options: dict[str, Any] = {"remote": cached_remote(seaweed.storage_options(), tmp_path / "c")}
    ds = open_dataset(url, **options)
    raw = bytearray((big_ds / "shard_00000.bin").read_bytes())
    raw[5 * MIB] ^= 0xFF
    seaweed.put(f"{prefix}/shard_00000.bin", bytes(raw))  # the same size, another ETag
    with pytest.raises(DataError) as caught:
        entry_bytes(ds)
    assert type(caught.value).__name__ == "ResumeMismatchError"
    with pytest.raises(ChecksumError) as reopened:  # a fresh open: the object differs from the manifest
        entry_bytes(open_dataset(url, **options))
    assert "shard_00000.bin" in str(reopened.value)


def test_a_manifest_corrupt_in_the_cache_is_fetched_again(seaweed, big_ds, tmp_path, caplog):
    """A digit changed in the cached manifest (still valid JSON)."""
    url = seaweed.upload_dir(big_ds, f"attack-{uuid.uuid4().hex[:8]}")
    options: dict[str, Any] = {"remote": cached_remote(seaweed.storage_options(), tmp_path / "c")}
    expected = entry_bytes(open_dataset(url, **options))
    raw = (big_ds / "manifest.json").read_bytes()
    at = raw.index(b'"block_xxh3_64": "') + 20
    bad = raw[:at] + (b"0" if raw[at : at + 1] != b"0" else b"1") + raw[at + 1 :]
    copies = [p for p in (tmp_path / "c").rglob("*") if p.is_file() and p.read_bytes() == raw]
    assert copies  # the cached object (the reader parses it where it is)
    for path in copies:
        path.write_bytes(bad)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert entry_bytes(open_dataset(url, **options)) == expected
    assert warnings_with(caplog, "does not match its own checksum")


def test_a_sidecar_flipped_on_the_wire_costs_one_open_not_every_one(seaweed, fault_proxy, big_ds, tmp_path, caplog):
    """A packed file's sidecar has no checksum anywhere: the reader names it, and the next open fetches it again."""
    from tokenloom.formats import convert_dataset

    url = f"s3://{seaweed.bucket}/attack-{uuid.uuid4().hex[:8]}/d.pbin"
    convert_dataset(
        big_ds,
        url,
        to="packed",
        target_remote=RemoteOptions.from_keywords(storage_options=seaweed.storage_options()),
        target_plan_cache_dir=tmp_path,
    )
    fault_proxy.fault_paths = ".tokenloom.json"
    fault_proxy.faults = ["flip"]
    options: dict[str, Any] = {
        "remote": RemoteOptions.from_keywords(
            storage_options=seaweed.storage_options(endpoint=fault_proxy.url), block_cache_dir=tmp_path / "c"
        )
    }
    with caplog.at_level(logging.WARNING, logger=LOGGER), pytest.raises(DataError, match="sidecar"):
        open_dataset(url, **options)
    assert fault_proxy.injected["flip"] == 1
    assert entry_bytes(open_dataset(url, **options)) == entry_bytes(open_dataset(big_ds))
    (said,) = warnings_with(caplog, "unverified")  # what is unverified and why, without blaming the block size
    assert "no block hashes in a manifest" in said and "block_size" not in said


def _digest_of_all(ds) -> str:
    import hashlib

    digest = hashlib.sha256()
    for i in range(len(ds)):
        digest.update(np.asarray(ds[i]).tobytes())
    return digest.hexdigest()


@pytest.mark.parametrize("limit", [None, "64MiB"])
def test_two_forked_readers_heal_the_same_corrupt_blocks_at_once(seaweed, big_ds, tmp_path, limit):
    """DataLoader-style workers forked after the open; each cached block corrupted on disk before they start."""
    import multiprocessing

    url = seaweed.upload_dir(big_ds, f"attack-{uuid.uuid4().hex[:8]}")
    options: dict[str, Any] = {"remote": cached_remote(seaweed.storage_options(), tmp_path / "c")}
    ds = open_dataset(url, remote=RemoteOptions.from_keywords(cache_limit=limit, remote=options["remote"]))
    expected = _digest_of_all(open_dataset(big_ds))
    assert _digest_of_all(ds) == expected
    blocks = sorted((tmp_path / "c").rglob(f"b{MIB}-*"))
    blocks = [b for b in blocks if b.suffix not in (".lock", ".tmp")]
    assert len(blocks) == 11 + -(-(big_ds / "shard_00000.idx").stat().st_size // MIB)  # the .idx by blocks too
    for block in blocks:
        raw = bytearray(block.read_bytes())
        raw[len(raw) // 3] ^= 0x10
        block.write_bytes(bytes(raw))
    with multiprocessing.get_context("fork").Pool(2) as pool:
        assert pool.map(_digest_of_all, [ds, ds]) == [expected, expected]
    assert (
        _digest_of_all(
            open_dataset(url, remote=RemoteOptions.from_keywords(cache_limit=limit, remote=options["remote"]))
        )
        == expected
    )


def test_a_block_discarded_by_another_reader_between_publish_and_map_is_fetched_again(
    seaweed, big_ds, tmp_path, monkeypatch
):
    """The interleaving the forked readers above hit at times, made certain: another reader's discard unlinks
    the cached block just after this reader found it published, before it maps it."""
    from tokenloom.formats.remote.cache import BlockCache

    url = seaweed.upload_dir(big_ds, f"attack-{uuid.uuid4().hex[:8]}")
    options: dict[str, Any] = {"remote": cached_remote(seaweed.storage_options(), tmp_path / "c")}
    expected = _digest_of_all(open_dataset(url, **options))
    publish, vanished = BlockCache._publish, []

    def publish_then_vanish(self, obj, name, start, end, check=None):
        path = publish(self, obj, name, start, end, check)
        if name == f"b{MIB}-4" and not vanished:
            vanished.append(path)
            path.unlink()
        return path

    monkeypatch.setattr(BlockCache, "_publish", publish_then_vanish)
    assert _digest_of_all(open_dataset(url, **options)) == expected
    assert vanished


def test_a_zero_byte_shard_is_verified_without_a_word(seaweed, tmp_path, caplog):
    """A .bin of 0 bytes (one empty document) has an empty hash list: nothing to fetch, nothing unverified."""
    empty = tmp_path / "empty"
    with open_writer(empty, format="native", dtype="uint16", vocab_size=50_000, eos_id=0) as writer:
        writer.add(np.array([], dtype=np.int64))
    url = seaweed.upload_dir(empty, f"attack-{uuid.uuid4().hex[:8]}")
    options: dict[str, Any] = {"remote": cached_remote(seaweed.storage_options(), tmp_path / "c")}
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert entry_bytes(open_dataset(url, validate="deep", **options)) == [b""]
    assert not warnings_with(caplog, "")


def test_truncated_cache_files_and_a_flipped_cached_index_are_fetched_again(seaweed, big_ds, tmp_path, caplog):
    url = seaweed.upload_dir(big_ds, f"attack-{uuid.uuid4().hex[:8]}")
    options: dict[str, Any] = {"remote": cached_remote(seaweed.storage_options(), tmp_path / "c")}
    expected = entry_bytes(open_dataset(url, **options))
    for path in [*(tmp_path / "c").rglob(f"b{MIB}-3"), *(tmp_path / "c").rglob("whole")]:
        with open(path, "r+b") as handle:
            handle.truncate(max(0, path.stat().st_size - 100))
    assert entry_bytes(open_dataset(url, **options)) == expected
    idx = (big_ds / "shard_00000.idx").read_bytes()
    last = (len(idx) - 1) // MIB  # the .idx is cached by blocks: its last one
    (cached,) = [p for p in (tmp_path / "c").rglob(f"b{MIB}-{last}") if p.read_bytes() == idx[last * MIB :]]
    part = idx[last * MIB :]
    cached.write_bytes(part[:-3] + bytes([part[-3] ^ 0x01]) + part[-2:])  # an overlap prefix, one bit
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert entry_bytes(open_dataset(url, **options)) == expected
    assert [w for w in warnings_with(caplog, "corrupt on disk") if str(cached) in w]


def _rehashed(local: Path, target: Path, change) -> Path:
    """A copy whose manifest's first data entry is changed by ``change``, its own checksum made right again."""
    import shutil

    import orjson
    import xxhash

    shutil.copytree(local, target)
    payload = orjson.loads((target / "manifest.json").read_bytes())
    payload.pop("checksum")
    change(next(f for f in payload["files"] if f["role"] == "data"))
    payload["checksum"] = xxhash.xxh3_128(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)).hexdigest()
    (target / "manifest.json").write_bytes(orjson.dumps(payload, option=orjson.OPT_INDENT_2))
    return target


@pytest.mark.parametrize(
    ("fmt", "change"),
    [
        ("native", lambda f: f.update(block_xxh3_64=f["block_xxh3_64"][:-16])),  # one hash short
        ("native", lambda f: f.update(block_xxh3_64=f["block_xxh3_64"] + "0" * 16)),  # one too many
        ("flat", lambda f: f.update(block_xxh3_64=[f["block_xxh3_64"]])),  # a list, not a string
    ],
)
def test_a_malformed_hash_list_in_a_remote_manifest_is_a_format_error_naming_it(seaweed, tmp_path, fmt, change):
    from tokenloom.formats import convert_dataset
    from tokenloom.formats.errors import FormatError

    local = tmp_path / "local"
    with open_writer(local, format="native", dtype="uint16", vocab_size=50_000, eos_id=0) as writer:
        writer.add(np.arange(1, 1000, dtype=np.int64))
    if fmt == "flat":
        convert_dataset(local, tmp_path / "flat", to="flat")
        local = tmp_path / "flat"
    url = seaweed.upload_dir(_rehashed(local, tmp_path / "bad", change), f"attack-{uuid.uuid4().hex[:8]}")
    with pytest.raises(FormatError) as caught:
        open_dataset(
            url,
            remote=RemoteOptions.from_keywords(
                storage_options=seaweed.storage_options(), block_cache_dir=tmp_path / "c"
            ),
        )
    assert caught.value.field == "files.block_xxh3_64" and f"{url}/manifest.json" in str(caught.value)


def test_truncated_and_reset_bodies_among_flips_read_right(seaweed, fault_proxy, big_ds, tmp_path):
    url = seaweed.upload_dir(big_ds, f"attack-{uuid.uuid4().hex[:8]}")
    fault_proxy.fault_paths = ".bin"
    fault_proxy.faults = ["truncate", "flip", "reset", "flip"]
    options = seaweed.storage_options(endpoint=fault_proxy.url)
    ds = open_dataset(
        url,
        remote=RemoteOptions.from_keywords(storage_options=options, block_cache_dir=tmp_path / "c", block_size=2 * MIB),
    )
    assert entry_bytes(ds) == entry_bytes(open_dataset(big_ds))
    assert sum(fault_proxy.injected.values()) == 4


def test_deep_validation_with_block_hashes_heals_at_first_map(seaweed, big_ds, tmp_path, caplog):
    url = seaweed.upload_dir(big_ds, f"attack-{uuid.uuid4().hex[:8]}")
    options: dict[str, Any] = {
        "remote": RemoteOptions.from_keywords(
            storage_options=seaweed.storage_options(), block_cache_dir=tmp_path / "c", block_size=2 * MIB
        )
    }
    open_dataset(url, validate="deep", **options)
    (block,) = list((tmp_path / "c").rglob(f"b{2 * MIB}-5"))  # the short last block
    raw = bytearray(block.read_bytes())
    raw[-1] ^= 0x01
    block.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert entry_bytes(open_dataset(url, validate="deep", **options)) == entry_bytes(open_dataset(big_ds))
    assert [w for w in warnings_with(caplog, "corrupt on disk") if str(block) in w]


CHECKSUM = (lambda raw: raw.replace(b'"vocab_size": 50000', b'"vocab_size": 50001'), ChecksumError, "checksum")


@pytest.mark.parametrize(
    ("fmt", "damage", "error", "says"),
    [
        (None, *CHECKSUM),
        ("native", *CHECKSUM),
        ("native", lambda raw: b"[1, 2]", FormatError, "not a JSON object"),
        ("native", lambda raw: raw[: len(raw) // 2], FormatError, "not a JSON object"),
    ],
    ids=["checksum", "checksum-native", "list-native", "cut-native"],
)
def test_a_manifest_damaged_in_the_store_is_a_named_error_naming_it(
    seaweed, tmp_path, caplog, fmt, damage, error, says
):
    """Every fetch brings the same bad bytes: after its re-fetches the open names the manifest and what is wrong
    with it (it once ended in a FileNotFoundError of the reader's listing, or 'the manifest records format None,
    not native'). A manifest that is no JSON object, opened without format=, is left to the readers (as locally:
    'no reader recognises this layout'), so that an endpoint that is a web server is named as such."""
    local = tmp_path / "local"
    with open_writer(local, format="native", dtype="uint16", vocab_size=50_000, eos_id=0) as writer:
        writer.add(np.arange(1, 1000, dtype=np.int64))
    raw = (local / "manifest.json").read_bytes()
    (local / "manifest.json").write_bytes(damage(raw))
    assert (local / "manifest.json").read_bytes() != raw
    url = seaweed.upload_dir(local, f"attack-{uuid.uuid4().hex[:8]}")
    remote = RemoteOptions.from_keywords(storage_options=seaweed.storage_options(), block_cache_dir=tmp_path / "c")
    with caplog.at_level(logging.WARNING, logger=LOGGER), pytest.raises(error) as caught:
        open_dataset(url, remote=remote, format=fmt)
    assert f"{url}/manifest.json" in str(caught.value) and says in str(caught.value)
    # then it is bad in the store, not on the wire
    assert len(warnings_with(caplog, "discarded, fetching it again")) == 2
