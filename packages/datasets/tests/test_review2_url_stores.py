"""Review 2: DatasetFactory.load(..., remote=RemoteOptions) of keyed/record stores at s3:// URLs.

Attacks: wrong and absent credentials, an absent prefix, a store whose meta.json names a key with no <key>.bin,
an sft store without its loss_mask key, and a DPO record store read by spawned DataLoader workers.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from test_remote_keyed import _dpo, _items, _options, _sft
from torch.utils.data import DataLoader

from tokenloom.datasets import DatasetFactory
from tokenloom.formats import DataError, RemoteOptions, StorageError

SEQ_LEN = 8


def _upload(seaweed, local: Path, kind: str) -> str:
    return seaweed.upload_dir(local, f"{kind}-{uuid.uuid4().hex[:8]}")


@pytest.mark.parametrize("kind", ["sft", "dpo"])
def test_a_wrong_secret_is_a_named_storage_error_without_the_secret(seaweed, tmp_path, monkeypatch, kind):
    monkeypatch.chdir(tmp_path)
    url = _upload(seaweed, (_sft if kind == "sft" else _dpo)(tmp_path / "local"), kind)
    wrong = RemoteOptions.from_keywords(
        storage_options=seaweed.storage_options(secret_access_key="not-the-secret-1234"),
        block_cache_dir=tmp_path / "c",
        retries=0,
    )
    with pytest.raises(StorageError) as caught:
        DatasetFactory.load(kind, url, seq_len=SEQ_LEN if kind == "sft" else None, remote=wrong)
    text = str(caught.value)
    assert url in text and "not-the-secret-1234" not in text
    assert not (tmp_path / "s3:").exists()


def test_absent_credentials_are_a_named_error(seaweed, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    url = _upload(seaweed, _sft(tmp_path / "local"), "sft")
    options = {k: v for k, v in seaweed.storage_options().items() if k not in ("access_key_id", "secret_access_key")}
    bare = RemoteOptions.from_keywords(storage_options=options, block_cache_dir=tmp_path / "c", retries=0)
    with pytest.raises(DataError) as caught:
        DatasetFactory.load("sft", url, seq_len=SEQ_LEN, remote=bare)
    assert url in str(caught.value)


def test_an_absent_prefix_is_a_named_error(seaweed, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = f"s3://{seaweed.bucket}/no-such-store-{uuid.uuid4().hex[:8]}"
    for kind, seq_len in (("sft", SEQ_LEN), ("dpo", None)):
        with pytest.raises(DataError) as caught:
            DatasetFactory.load(kind, url, seq_len=seq_len, remote=_options(seaweed, tmp_path / "c"))
        assert url in str(caught.value)


def test_a_meta_key_without_its_bin_object_is_named(seaweed, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = _dpo(tmp_path / "local")
    (local / "rejected_mask.bin").unlink()
    url = _upload(seaweed, local, "dpo")
    with pytest.raises(DataError) as caught:
        DatasetFactory.load("dpo", url, remote=_options(seaweed, tmp_path / "c"))
    assert "rejected_mask" in str(caught.value)


def test_an_sft_store_without_loss_mask_at_a_url_is_named_like_local(seaweed, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = _sft(tmp_path / "local")
    meta = json.loads((local / "meta.json").read_text())
    del meta["loss_mask"]
    (local / "meta.json").write_text(json.dumps(meta))
    (local / "loss_mask.bin").unlink()
    with pytest.raises(DataError) as local_error:
        DatasetFactory.load("sft", local, seq_len=SEQ_LEN)
    url = _upload(seaweed, local, "sft")
    with pytest.raises(DataError) as remote_error:
        DatasetFactory.load("sft", url, seq_len=SEQ_LEN, remote=_options(seaweed, tmp_path / "c"))
    assert type(remote_error.value) is type(local_error.value)
    assert "loss_mask" in str(remote_error.value) and url in str(remote_error.value)


def test_a_dpo_store_at_a_url_in_spawned_workers(seaweed, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = _dpo(tmp_path / "local")
    url = _upload(seaweed, local, "dpo")
    ds = DatasetFactory.load("dpo", url, remote=_options(seaweed, tmp_path / "node0"))
    reference = _items(DatasetFactory.load("dpo", local))
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn", timeout=120)
    got = [{key: value.numpy().tobytes() for key, value in item.items()} for item in loader]
    assert got == reference


def test_a_settings_dict_as_remote_is_a_named_config_error(tmp_path):
    from tokenloom.formats import ConfigError

    with pytest.raises(ConfigError, match="RemoteOptions.from_keywords") as caught:
        DatasetFactory.load("sft", "s3://bucket/prefix", seq_len=SEQ_LEN, remote={"endpoint": "http://127.0.0.1:9"})  # type: ignore[call-overload]  # pyright: ignore[reportCallIssue, reportArgumentType]
    assert caught.value.field == "remote"
