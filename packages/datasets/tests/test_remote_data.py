"""Datasets over data in object storage (a real S3 server): URLs are never local paths, states name changed objects."""

from __future__ import annotations

import pickle
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from tokenloom.datasets import MemoryMappedDataset, MixtureDataset, PackedDocumentDataset, collate
from tokenloom.formats import ConfigError, RemoteOptions, ResumeMismatchError, open_writer
from tokenloom.sampler import ResumableDistributedSampler

BLOCK = 4096
SEQ_LEN = 31


def _write(root: Path, *, seed: int = 0, docs: int = 200) -> Path:
    rng = np.random.default_rng(seed)
    with open_writer(root, dtype="uint16", vocab_size=1000, eos_id=0, shard_size_tokens=6000) as writer:
        for _ in range(docs):
            writer.add(np.append(rng.integers(1, 1000, size=int(rng.integers(5, 120))), 0))
    return root


@pytest.fixture
def local(tmp_path: Path) -> Path:
    return _write(tmp_path / "local")


@pytest.fixture
def remote(seaweed, local: Path) -> str:
    return seaweed.upload_dir(local, f"ds-{uuid.uuid4().hex[:8]}")


def _open(cls, data, seaweed, cache: Path, **kwargs):
    remote = RemoteOptions.from_keywords(storage_options=seaweed.storage_options(), block_cache_dir=cache)
    plans = {"plan_cache_dir": cache} if cls is PackedDocumentDataset else {}
    return cls(data, SEQ_LEN, remote=remote, **plans, **kwargs)


def _rows(ds) -> list[bytes]:
    return [ds[i]["input_ids"].numpy().tobytes() + ds[i]["labels"].numpy().tobytes() for i in range(len(ds))]


def test_windows_from_s3_equal_local_in_workers_and_no_local_s3_dir(seaweed, local, remote, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ds = _open(MemoryMappedDataset, remote, seaweed, tmp_path / "node0", pack_sequences=True)
    reference = MemoryMappedDataset(local, SEQ_LEN, pack_sequences=True)
    assert len(ds) == len(reference) and _rows(ds) == _rows(reference)
    assert str(ds.dataset.root) == remote and len(ds.dataset) == 200  # reopened from the URL, not "s3:/..."
    copy = pickle.loads(pickle.dumps(ds))  # what a spawned worker receives
    assert len(copy.dataset) == 200 and _rows(copy) == _rows(reference)
    loader = DataLoader(ds, batch_size=5, num_workers=2, collate_fn=collate, timeout=120)
    got = torch.cat([batch["input_ids"] for batch in loader])
    want = torch.stack([reference[i]["input_ids"] for i in range(len(reference))])
    assert torch.equal(got, want)
    assert not (tmp_path / "s3:").exists() and list((tmp_path / "node0").rglob("b*-0"))


def test_packed_from_s3_keeps_its_plan_in_the_local_cache(seaweed, local, remote, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cache = tmp_path / "node0"
    ds = PackedDocumentDataset(
        remote,
        64,
        plan_cache_dir=cache,
        remote=RemoteOptions.from_keywords(storage_options=seaweed.storage_options(), block_cache_dir=cache),
    )
    reference = PackedDocumentDataset(local, 64, plan_cache_dir=tmp_path / "plans")
    assert len(ds) == len(reference)
    for i in range(len(ds)):
        assert torch.equal(ds[i]["input_ids"], reference[i]["input_ids"])
    assert ds.plan_dir.parent == cache and ds.plan_dir.is_dir()  # never next to the URL
    assert not (tmp_path / "s3:").exists()


def test_file_pattern_on_a_url_keeps_the_etags_in_the_fingerprint(seaweed, local, remote, tmp_path):
    ds = _open(MemoryMappedDataset, remote, seaweed, tmp_path / "c", file_pattern="*00001.bin")
    assert len(ds.data_objects()) >= 1 and all(url.startswith(remote) for url in ds.data_objects())
    assert ds.dataset.shards[0].name.endswith("00001")


def test_remote_options_on_local_data_are_a_config_error(local, tmp_path):
    with pytest.raises(ConfigError, match="remote applies to data in object storage"):
        MemoryMappedDataset(local, SEQ_LEN, remote=RemoteOptions.from_keywords(storage_options={"region": "x"}))
    with pytest.raises(ConfigError, match="remote applies to data in object storage"):
        MemoryMappedDataset(local, SEQ_LEN, remote=RemoteOptions.from_keywords(block_cache_dir=tmp_path))


def _replace_last_shard(seaweed, local: Path, url: str) -> str:
    name = sorted(p.name for p in local.glob("*.bin"))[-1]
    data = bytearray((local / name).read_bytes())
    data[-4:-2] = b"\x07\x00"  # same size, other bytes: a new ETag
    key = url.split("/", 3)[3] + "/" + name
    seaweed.put(key, bytes(data))
    return name


def test_an_object_changed_between_save_and_resume_is_named(seaweed, local, remote, tmp_path):
    ds = _open(MemoryMappedDataset, remote, seaweed, tmp_path / "c")
    sampler = ResumableDistributedSampler(ds, num_replicas=1, rank=0, seed=3)
    iterator = iter(sampler)
    for _ in range(7):
        next(iterator)
    sampler_state, dataset_state = sampler.state_dict(), ds.state_dict()
    mixture_state = MixtureDataset([ds, ds], [0.5, 0.5], seed=0, num_samples=10).state_dict()
    assert set(sampler_state["data_objects"]) == set(dataset_state["data_objects"]) == set(ds.data_objects())
    assert len(ds.data_objects()) == 2 * len(list(local.glob("*.bin"))) + 1  # every .bin and .idx, the manifest
    name = _replace_last_shard(seaweed, local, remote)
    resumed = _open(MemoryMappedDataset, remote, seaweed, tmp_path / "other-node")
    with pytest.raises(ResumeMismatchError, match=rf"{name} changed \(saved size:ETag") as caught:
        ResumableDistributedSampler(resumed, num_replicas=2, rank=1, seed=3).load_state_dict(sampler_state)
    assert caught.value.path is not None and caught.value.path.endswith(name)
    with pytest.raises(ResumeMismatchError, match=rf"{name} changed \(saved size:ETag"):
        resumed.load_state_dict(dataset_state)
    with pytest.raises(ResumeMismatchError, match=rf"{name} changed \(saved size:ETag"):
        MixtureDataset([resumed, resumed], [0.5, 0.5], seed=0, num_samples=10).load_state_dict(mixture_state)
    secret = str(seaweed.storage_options()["secret_access_key"])
    assert secret not in str(sampler_state) and secret not in str(dataset_state)


def test_an_object_changed_under_a_running_loader_is_named(seaweed, local, remote, tmp_path):
    ds = _open(MemoryMappedDataset, remote, seaweed, tmp_path / "c")
    loader = DataLoader(ds, batch_size=4, num_workers=1, collate_fn=collate, timeout=120)
    iterator = iter(loader)
    next(iterator)  # the first shard's block is cached; the last shard's is not
    name = _replace_last_shard(seaweed, local, remote)
    with pytest.raises(ResumeMismatchError, match=rf"{name} changed since it was opened"):
        for _ in iterator:
            pass


def test_dataset_factory_passes_remote_options_and_never_makes_a_local_dir(tmp_path, monkeypatch):
    from tokenloom.datasets import DatasetFactory
    from tokenloom.formats import DataError

    monkeypatch.chdir(tmp_path)
    options = RemoteOptions(store_options={"region": "x"})
    with pytest.raises(ConfigError, match=r"remote applies to data in object storage"):
        DatasetFactory.load("sft", tmp_path / "store", seq_len=8, remote=options)
    with pytest.raises(ConfigError, match=r"remote applies to data in object storage"):
        DatasetFactory.load("dpo", tmp_path / "store", remote=options)  # record mode too
    with pytest.raises(TypeError):
        DatasetFactory.load("sft", tmp_path / "store", seq_len=8, cache_dir=tmp_path / "c")  # type: ignore[call-overload]
    with pytest.raises(ConfigError, match="is not a RemoteOptions") as caught:
        DatasetFactory.load("sft", "s3://bucket/store", seq_len=8, remote={"endpoint": "x"})  # type: ignore[call-overload]
    assert caught.value.field == "remote"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens: no network
    with pytest.raises(DataError):
        DatasetFactory.load(
            "sft",
            "s3://bucket/store",
            seq_len=8,
            remote=RemoteOptions.from_keywords(block_cache_dir=tmp_path / "c", retries=0),
        )
    assert not (tmp_path / "s3:").exists()
