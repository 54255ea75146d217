"""Record stores (sft, dpo, grpo) read from a real S3 server: ``open_records(URL)`` equals the local store.

Found by the chaos integration test (integration-tests/tests/test_chaos_torchrun.py): ``open_records`` took
every path for a local directory, so a post-training store in a bucket could not be read at all; and a
record store had no manifest, so its bytes were read unverified. Now the writer seals it with the manifest
native datasets carry (block hashes), and every block read from the bucket is checked: a flip on the wire
(the fault proxy's "flip") is fetched again, one that persists is a ChecksumError.
"""

from __future__ import annotations

import logging
import pickle
import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tokenloom.formats import RecordStoreWriter, open_records
from tokenloom.formats.cli.commands import validate
from tokenloom.formats.errors import ChecksumError
from tokenloom.formats.io.manifest import read_manifest

LOGGER = "tokenloom.formats.remote"


def _values(record: dict[str, object]) -> dict[str, list]:
    return {key: [np.asarray(v).tolist() for v in value] if isinstance(value, list) else np.asarray(value).tolist()
            for key, value in record.items()}  # fmt: skip


def test_a_record_store_in_a_bucket_reads_as_the_local_one(seaweed, tmp_path, monkeypatch):
    local = tmp_path / "grpo"
    with RecordStoreWriter(local, train_type="grpo", dtype="uint16", key_dtypes={"masks": "bool"}) as writer:
        for i in range(40):
            responses = [[i, i + 1][: 1 + j % 2] * (1 + j) for j in range(1 + i % 3)]
            masks = [[1] * len(r) for r in responses]
            writer.add_record(
                {"prompts": [i, 7], "responses": responses, "masks": masks, "rewards": [0.5] * len(masks)}
            )
    url = seaweed.upload_dir(local, f"records-{uuid.uuid4().hex[:8]}")
    for name, value in {**seaweed.env, "AWS_ENDPOINT_URL": seaweed.endpoint, "AWS_ALLOW_HTTP": "true",
                        "AWS_REGION": "us-east-1", "TOKENLOOM_CACHE_DIR": str(tmp_path / "cache")}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    remote, expected = open_records(url), open_records(local)
    assert str(remote.path) == url and len(remote) == len(expected) == 40  # named by its URL, not the local view
    assert [_values(remote.record(i)) for i in range(40)] == [_values(expected.record(i)) for i in range(40)]
    copy = pickle.loads(pickle.dumps(remote))  # what a DataLoader worker receives: it reads through the cache
    assert _values(copy.record(39)) == _values(expected.record(39))
    assert list((tmp_path / "cache").rglob("b*-0"))  # the data files came by blocks through the node's cache


def _dpo(root: Path, records: int = 3000) -> Path:
    """A DPO store whose chosen.bin spans two 1 MiB hash blocks."""
    rng = np.random.default_rng(5)
    masks = {"chosen_mask": "bool", "rejected_mask": "bool"}
    with RecordStoreWriter(root, train_type="dpo", dtype="uint16", vocab_size=50_000, key_dtypes=masks) as writer:
        for i in range(records):
            chosen, rejected = rng.integers(1, 50_000, 200 + i % 7), rng.integers(1, 50_000, 20 + i % 5)
            writer.add_record(
                {"chosen": chosen, "chosen_mask": chosen % 2, "rejected": rejected, "rejected_mask": rejected % 2}
            )
    return root


@pytest.fixture(scope="module")
def dpo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _dpo(tmp_path_factory.mktemp("records") / "dpo")


def _at(seaweed, endpoint: str, tmp_path: Path, monkeypatch) -> None:
    for name, value in {**seaweed.env, "AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true",
                        "AWS_REGION": "us-east-1", "TOKENLOOM_CACHE_DIR": str(tmp_path / "cache")}.items():  # fmt: skip
        monkeypatch.setenv(name, value)


def _all(store) -> list[dict[str, list]]:
    return [_values(store.record(i)) for i in range(len(store))]


def _warnings(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and text in r.getMessage()]


def test_the_writer_seals_a_record_store_with_the_native_manifest(dpo_store, tmp_path):
    manifest = read_manifest(dpo_store)
    assert manifest.format == "bin-meta" and manifest.metadata["layout"] == "records"
    assert manifest.num_documents == 3000 and manifest.vocab_size == 50_000
    data = {f.name: f for f in manifest.files if f.role == "data"}
    assert sorted(data) == ["chosen.bin", "chosen_mask.bin", "rejected.bin", "rejected_mask.bin"]
    assert all(f.blocks is not None for f in data.values()) and len(data["chosen.bin"].blocks or "") == 2
    assert [f.name for f in manifest.files if f.role == "index"] == ["meta.json"]
    # a local open checks the index checksums: a meta.json byte changed in place is caught
    copy = tmp_path / "copy"
    shutil.copytree(dpo_store, copy)
    meta = copy / "meta.json"
    raw = bytearray(meta.read_bytes())
    raw[-3] = ord("9") if raw[-3] != ord("9") else ord("8")  # an offset changed, the size kept
    meta.write_bytes(bytes(raw))
    with pytest.raises(ChecksumError) as caught:
        open_records(copy)
    assert "meta.json" in str(caught.value)
    # deep: every data checksum
    shutil.copytree(dpo_store, tmp_path / "deep")
    chosen = tmp_path / "deep" / "chosen.bin"
    raw = bytearray(chosen.read_bytes())
    raw[12345] ^= 0xFF
    chosen.write_bytes(bytes(raw))
    assert len(open_records(tmp_path / "deep")) == 3000  # fast: sizes only
    with pytest.raises(ChecksumError, match="chosen.bin"):
        open_records(tmp_path / "deep", validate="deep")


def test_a_flipped_byte_on_the_wire_is_fetched_again(seaweed, fault_proxy, dpo_store, tmp_path, monkeypatch, caplog):
    url = seaweed.upload_dir(dpo_store, f"records-{uuid.uuid4().hex[:8]}")
    _at(seaweed, fault_proxy.url, tmp_path, monkeypatch)
    fault_proxy.fault_paths = "/chosen.bin"
    fault_proxy.faults = ["flip"]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert _all(open_records(url)) == _all(open_records(dpo_store))
    assert fault_proxy.injected["flip"] == 1  # the flip was served, caught by the block hash, fetched again
    assert len(_warnings(caplog, "arrived with a wrong hash")) == 1 and not _warnings(caplog, "unverified")


def test_a_block_that_never_arrives_right_is_a_checksum_error(seaweed, fault_proxy, dpo_store, tmp_path, monkeypatch):
    url = seaweed.upload_dir(dpo_store, f"records-{uuid.uuid4().hex[:8]}")
    _at(seaweed, fault_proxy.url, tmp_path, monkeypatch)
    fault_proxy.fault_paths = "/chosen.bin"
    fault_proxy.faults = ["flip"] * 10
    store = open_records(url)
    with pytest.raises(ChecksumError) as caught:
        _all(store)
    message = str(caught.value)
    assert f"{url}/chosen.bin" in message and "block 0 (bytes 0-" in message and "fetched 3 times" in message
    assert caught.value.field == "block_xxh3_64" and "restore the object" in message
    assert fault_proxy.injected["flip"] == 3


def test_a_store_without_a_manifest_opens_with_one_warning(seaweed, dpo_store, tmp_path, monkeypatch, caplog):
    old = tmp_path / "old"  # as AstrAI or an older tokenloom wrote it
    shutil.copytree(dpo_store, old)
    (old / "manifest.json").unlink()
    url = seaweed.upload_dir(old, f"records-{uuid.uuid4().hex[:8]}")
    _at(seaweed, seaweed.endpoint, tmp_path, monkeypatch)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert _all(open_records(url)) == _all(open_records(dpo_store))
        open_records(url)
    (warning,) = _warnings(caplog, "unverified")
    assert "4 of 4 data files have no block hashes" in warning and "tokenloom validate --write-manifest" in warning


def test_validate_write_manifest_seals_a_record_store(seaweed, dpo_store, tmp_path, monkeypatch, caplog):
    old = tmp_path / "old"
    shutil.copytree(dpo_store, old)
    (old / "manifest.json").unlink()
    result = CliRunner().invoke(validate, [str(old), "--format", "bin-meta", "--write-manifest"])
    assert result.exit_code == 0, result.output
    assert "block hashes of 5 files of a record store (3,000 records)" in result.output
    assert "records    3,000" in result.output and "problems   none" in result.output
    written, sealed = read_manifest(old), read_manifest(dpo_store)
    assert written.files == sealed.files and written.num_tokens == sealed.num_tokens
    again = CliRunner().invoke(validate, [str(old), "--write-manifest", "--deep"])
    assert again.exit_code == 0 and "block hashes already recorded" in again.output
    url = seaweed.upload_dir(old, f"records-{uuid.uuid4().hex[:8]}")
    _at(seaweed, seaweed.endpoint, tmp_path, monkeypatch)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert len(open_records(url)) == 3000
    assert not _warnings(caplog, "unverified")
    # a damaged store is never sealed: its reader's error, and no manifest
    bad = tmp_path / "bad"
    shutil.copytree(old, bad)
    (bad / "manifest.json").unlink()
    (bad / "rejected.bin").write_bytes((bad / "rejected.bin").read_bytes()[:-2])
    refused = CliRunner().invoke(validate, [str(bad), "--write-manifest"])
    assert refused.exit_code == 1 and "rejected.bin" in refused.output and not (bad / "manifest.json").exists()


@pytest.mark.parametrize("deep", [False, True])
def test_validate_checks_an_sft_record_stores_manifest(tmp_path, deep):
    """An sft record store (what tokenize --train-type sft writes) is also a token stream; validate showed it as one
    and never read its manifest: a changed sequence.bin was 'problems none (deep validation)', a changed meta.json
    passed fast validation. Now the record store's manifest is checked first, as for dpo and grpo stores."""
    store = tmp_path / "sft"
    with RecordStoreWriter(store, train_type="sft", dtype="uint16", key_dtypes={"loss_mask": "bool"}) as writer:
        for i in range(50):
            writer.add_record({"sequence": [i + 1, i + 2, 0], "loss_mask": [0, 1, 1]})
    assert CliRunner().invoke(validate, [str(store), *(["--deep"] if deep else [])]).exit_code == 0
    name = "sequence.bin" if deep else "meta.json"
    data = bytearray((store / name).read_bytes())
    if deep:
        data[len(data) // 2] ^= 0x04
    else:
        data += b" "  # still the same JSON: only the manifest tells
    (store / name).write_bytes(bytes(data))
    result = CliRunner().invoke(validate, [str(store), *(["--deep"] if deep else [])])
    assert result.exit_code == 1 and "ChecksumError" in result.output and name in result.output, result.output
