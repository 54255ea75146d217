"""One vocabulary: ``path``, ``seq_len``, ``format`` and ``train_type``.

``DatasetFactory.load`` takes AstrAI's names (``load_path``, ``window_size``, ``storage_type``) silently:
they are the seed's API users port from. An AstrAI name together with its tokenloom one is a ConfigError.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from tokenloom.datasets import ArrayStore, DatasetFactory, KeyedDataset, RecordDataset
from tokenloom.formats import ConfigError, open_store, open_writer

SEQUENCE = np.arange(1, 14, dtype=np.uint16)
LOSS_MASK = np.array([0, 1] * 6 + [1], dtype=np.uint8)


def sft_store(path: Path) -> Path:
    with open_writer(path, format="bin-meta", dtype="uint16", vocab_size=100, train_type="sft") as writer:
        writer.add_keyed({"sequence": SEQUENCE, "loss_mask": LOSS_MASK})
    return path


def dpo_record_store(root: Path) -> Path:
    """AstrAI's record-mode bin store: chosen and rejected differ in length, every key carries offsets."""
    root.mkdir()
    records = {
        "chosen": ([[1, 2, 3], [4, 5]], "int32"),
        "rejected": ([[6], [7, 8, 9]], "int32"),
        "chosen_mask": ([[0, 1, 1], [0, 1]], "bool"),
        "rejected_mask": ([[1], [0, 1, 1]], "bool"),
    }
    meta = {}
    for key, (rows, dtype) in records.items():
        np.asarray([v for row in rows for v in row], dtype=dtype).tofile(root / f"{key}.bin")
        offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).tolist()
        meta[key] = {"shape": [offsets[-1]], "dtype": dtype, "offsets": offsets}
    (root / "meta.json").write_text(json.dumps(meta))
    return root


def samples(ds) -> list[dict[str, list]]:
    return [{key: value.tolist() for key, value in ds[i].items()} for i in range(len(ds))]


def test_astrai_names_are_accepted_silently(tmp_path: Path) -> None:
    path = sft_store(tmp_path / "sft")
    records = dpo_record_store(tmp_path / "dpo")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = DatasetFactory.load("sft", path, seq_len=4, stride=2, format="bin")
        positional = DatasetFactory.load("sft", path, 4, 2, "bin")  # AstrAI's order: train_type, load_path, ...
        astrai = DatasetFactory.load(train_type="sft", load_path=path, window_size=4, stride=2, storage_type="bin")
        mixed = DatasetFactory.load("sft", path, window_size=4, stride=2, storage_type="bin")
        astrai_records = DatasetFactory.load("dpo", load_path=records)
        new_records = DatasetFactory.load("dpo", records)
    assert isinstance(astrai, KeyedDataset) and astrai.seq_len == 4 and len(astrai) == 5
    assert samples(astrai) == samples(new) == samples(positional) == samples(mixed)
    assert isinstance(astrai_records, RecordDataset)
    assert samples(astrai_records) == samples(new_records)
    assert astrai.fingerprint() == new.fingerprint()


@pytest.mark.parametrize(
    ("new", "old", "value"),
    [("path", "load_path", None), ("seq_len", "window_size", 4), ("format", "storage_type", "bin")],
)
def test_an_astrai_name_with_its_new_one_is_a_config_error(tmp_path: Path, new: str, old: str, value) -> None:
    path = sft_store(tmp_path / "sft")
    given = {"path": path, "seq_len": 4, "format": "bin", old: path if value is None else value}
    with pytest.raises(ConfigError, match=rf"got both {new}= and {old}="):
        DatasetFactory.load("sft", **given)


def test_a_missing_path_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="needs path"):
        DatasetFactory.load("sft", seq_len=4)  # pyright: ignore[reportArgumentType]


def test_keyed_dataset_needs_seq_len() -> None:
    store = ArrayStore({"sequence": SEQUENCE, "loss_mask": LOSS_MASK})
    assert KeyedDataset(store, "sft", seq_len=4).seq_len == 4
    with pytest.raises(ConfigError, match="needs seq_len"):
        KeyedDataset(store, "sft")


def test_the_fingerprint_of_a_saved_state_is_unchanged_by_the_rename(tmp_path: Path) -> None:
    """A state saved before the rename (its fingerprint hashes ``window=``) loads after it."""
    from tokenloom.datasets import settings_fingerprint

    store = open_store(sft_store(tmp_path / "sft"))
    ds = KeyedDataset(store, "sft", 4)
    before = settings_fingerprint(
        store=str(store.path),
        length=len(store),
        train_type="sft",
        window=4,
        stride=4,
        keys=["sequence", "loss_mask"],
        mask_alignment="labels",
    )
    ds.load_state_dict({"fingerprint": before})
    assert torch.equal(ds[0]["input_ids"], torch.tensor([1, 2, 3, 4]))
