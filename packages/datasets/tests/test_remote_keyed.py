"""DatasetFactory over keyed and record stores in object storage (a real S3 server): equal to the local store,
in DataLoader workers too, with the user's RemoteOptions carried by the store; a bad endpoint is a named error."""

from __future__ import annotations

import json
import pickle
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from tokenloom.datasets import DatasetFactory, KeyedDataset, RecordDataset
from tokenloom.formats import RemoteOptions, StorageError

SEQ_LEN = 8


def _save_bin(root: Path, arrays: dict[str, tuple[list[list[int]], str]], record_keys: tuple[str, ...]) -> Path:
    """An AstrAI ``save_bin`` layout: ``<key>.bin`` + ``meta.json`` (offsets for ``record_keys``)."""
    root.mkdir(parents=True)
    meta = {}
    for key, (records, dtype) in arrays.items():
        flat = np.concatenate([np.asarray(r, dtype=dtype) for r in records])
        flat.tofile(root / f"{key}.bin")
        meta[key] = {"shape": [len(flat)], "dtype": dtype}
        if key in record_keys:
            meta[key]["offsets"] = np.concatenate([[0], np.cumsum([len(r) for r in records])]).tolist()
    (root / "meta.json").write_text(json.dumps(meta))
    return root


def _sft(root: Path) -> Path:
    rng = np.random.default_rng(3)
    tokens = rng.integers(1, 1000, size=400).tolist()
    mask = rng.integers(0, 2, size=400).tolist()
    return _save_bin(root, {"sequence": ([tokens], "int32"), "loss_mask": ([mask], "int32")}, ())


def _dpo(root: Path) -> Path:
    rng = np.random.default_rng(4)
    sides: dict[str, tuple[list[list[int]], str]] = {}
    for side in ("chosen", "rejected"):
        lengths = rng.integers(3, 20, size=12)
        sides[side] = ([rng.integers(1, 1000, size=n).tolist() for n in lengths], "int32")
        sides[f"{side}_mask"] = ([rng.integers(0, 2, size=n).tolist() for n in lengths], "bool")
    return _save_bin(root, sides, tuple(sides))


def _options(seaweed, cache: Path) -> RemoteOptions:
    return RemoteOptions.from_keywords(storage_options=seaweed.storage_options(), block_cache_dir=cache)


def _items(ds) -> list[dict[str, bytes]]:
    return [{key: value.numpy().tobytes() for key, value in ds[i].items()} for i in range(len(ds))]


@pytest.mark.parametrize(("kind", "make", "seq_len"), [("sft", _sft, SEQ_LEN), ("dpo", _dpo, None)])
def test_a_store_at_a_url_equals_the_local_one_in_workers(seaweed, tmp_path, monkeypatch, kind, make, seq_len):
    monkeypatch.chdir(tmp_path)
    local = make(tmp_path / "local")
    url = seaweed.upload_dir(local, f"{kind}-{uuid.uuid4().hex[:8]}")
    remote = _options(seaweed, tmp_path / "node0")
    ds = DatasetFactory.load(kind, url, seq_len=seq_len, remote=remote)
    reference = DatasetFactory.load(kind, local, seq_len=seq_len)
    assert type(ds) is type(reference) is (KeyedDataset if seq_len else RecordDataset)
    assert ds.store.remote == remote and str(ds.store.path) == url  # carried; named by its URL
    assert _items(ds) == _items(reference)
    copy = pickle.loads(pickle.dumps(ds))  # what a spawned worker receives
    assert copy.store.remote == remote and _items(copy) == _items(reference)
    loader = DataLoader(ds, batch_size=None, num_workers=2, timeout=120)
    got = [{key: value.numpy().tobytes() for key, value in item.items()} for item in loader]
    assert got == _items(reference)
    assert not (tmp_path / "s3:").exists() and list((tmp_path / "node0").rglob("b*-0"))


def test_a_bad_endpoint_is_a_named_error(seaweed, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = seaweed.upload_dir(_sft(tmp_path / "local"), f"sft-{uuid.uuid4().hex[:8]}")
    bad = RemoteOptions.from_keywords(
        storage_options=seaweed.storage_options(endpoint="http://127.0.0.1:9"),  # nothing listens: no network
        block_cache_dir=tmp_path / "c",
        retries=0,
    )
    for kind, seq_len in (("sft", SEQ_LEN), ("dpo", None)):
        with pytest.raises(StorageError) as caught:
            DatasetFactory.load(kind, url, seq_len=seq_len, remote=bad)
        assert url in str(caught.value)
        assert str(seaweed.storage_options()["secret_access_key"]) not in str(caught.value)
    assert not (tmp_path / "s3:").exists()


def test_an_h5_store_at_a_url_equals_the_local_one(seaweed, tmp_path):
    h5py = pytest.importorskip("h5py")
    local = tmp_path / "local"
    local.mkdir()
    rng = np.random.default_rng(5)
    with h5py.File(local / "train.h5", "w") as f:
        for key, high in (("sequence", 1000), ("loss_mask", 2)):  # AstrAI's save_h5: a group of data_<i> per key
            group = f.create_group(key)
            for idx in range(3):
                group.create_dataset(f"data_{idx}", data=rng.integers(0, high, size=100).astype(np.int32))
    url = seaweed.upload_dir(local, f"h5-{uuid.uuid4().hex[:8]}")
    ds = DatasetFactory.load("sft", url, seq_len=SEQ_LEN, remote=_options(seaweed, tmp_path / "c"))
    reference = DatasetFactory.load("sft", local, seq_len=SEQ_LEN)
    assert _items(ds) == _items(reference)
    copy = pickle.loads(pickle.dumps(ds))
    assert all(torch.equal(copy[i]["input_ids"], reference[i]["input_ids"]) for i in range(len(ds)))
