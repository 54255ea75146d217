"""DatasetFactory over real keyed stores written by tokenloom.formats: HDF5 and bin + meta.json, every type.

Each store has two segments, and windows run across the segment boundary;
every expected value below is worked out by hand from the arrays written.
"""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from tokenloom.datasets import IGNORE_INDEX, DatasetFactory, collate
from tokenloom.formats import DataError, MissingKeyError, open_writer

pytest.importorskip("h5py")

X = IGNORE_INDEX

SEGMENTS = {
    "seq": [{"sequence": [10, 11, 12, 13]}, {"sequence": [14, 15, 16]}],
    "sft": [
        {"sequence": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1]},
        {"sequence": [5, 6, 7], "loss_mask": [0, 1, 1]},
    ],
    "dpo": [
        {"chosen": [1, 2, 3, 4], "rejected": [1, 2, 8, 9], "chosen_mask": [0, 0, 1, 1], "rejected_mask": [0, 0, 1, 0]},
        {"chosen": [5, 6, 7], "rejected": [5, 6, 0], "chosen_mask": [0, 1, 1], "rejected_mask": [0, 1, 0]},
    ],
    "grpo": [
        {"prompts": [1, 2, 3], "responses": [5, 6, 7], "masks": [0, 1, 1], "rewards": [0.5, 0.5, 0.5]},
        {"prompts": [4], "responses": [8], "masks": [1], "rewards": [-1.0]},
    ],
}
WINDOW = {"seq": 3, "sft": 3, "dpo": 3, "grpo": 2}

DPO_KEYS = ("input_ids", "labels", "mask")


def _dpo_sample(chosen: tuple, rejected: tuple) -> dict[str, list]:
    """A DPO sample's columns from its sides' (input_ids, labels, mask)."""
    sides = (("chosen", chosen), ("rejected", rejected))
    return {f"{side}_{key}": value for side, columns in sides for key, value in zip(DPO_KEYS, columns, strict=True)}


EXPECTED = {
    "seq": [
        {"input_ids": [10, 11, 12], "labels": [11, 12, 13]},
        {"input_ids": [13, 14, 15], "labels": [14, 15, 16]},
    ],
    "sft": [
        {"input_ids": [1, 2, 3], "labels": [X, 3, 4], "loss_mask": [0, 1, 1], "position_ids": [0, 1, 2]},
        {"input_ids": [4, 5, 6], "labels": [X, 6, 7], "loss_mask": [0, 1, 1], "position_ids": [0, 1, 2]},
    ],
    # (input_ids, labels, mask) of the chosen, then of the rejected side
    "dpo": [
        _dpo_sample(([1, 2, 3], [X, 3, 4], [0, 1, 1]), ([1, 2, 8], [X, 8, X], [0, 1, 0])),
        _dpo_sample(([4, 5, 6], [X, 6, 7], [0, 1, 1]), ([9, 5, 6], [X, 6, X], [0, 1, 0])),
    ],
    "grpo": [
        {"prompts": [1, 2], "responses": [5, 6], "masks": [0, 1], "rewards": [0.5, 0.5]},
        {"prompts": [3, 4], "responses": [7, 8], "masks": [1, 1], "rewards": [0.5, -1.0]},
    ],
}
FORMATS = {"h5": ("store.h5", "h5"), "bin-meta": ("store", "bin")}


def write_store(tmp_path, store_format, train_type):
    name, _ = FORMATS[store_format]
    path = tmp_path / f"{train_type}-{name}"
    with open_writer(path, format=store_format, dtype="uint16", vocab_size=100, train_type=train_type) as writer:
        for segment in SEGMENTS[train_type]:
            writer.add_keyed({key: np.asarray(value) for key, value in segment.items()})
    return path


def as_lists(sample):
    return {key: value.tolist() for key, value in sample.items()}


@pytest.mark.parametrize("store_format", sorted(FORMATS))
@pytest.mark.parametrize("train_type", sorted(SEGMENTS))
def test_every_type_over_a_real_store(tmp_path, store_format, train_type):
    path = write_store(tmp_path, store_format, train_type)
    for storage_type in (None, FORMATS[store_format][1]):
        ds = DatasetFactory.load(train_type, path, window_size=WINDOW[train_type], storage_type=storage_type)
        assert [as_lists(ds[i]) for i in range(len(ds))] == EXPECTED[train_type]
    sample = ds[0]
    for key, value in sample.items():
        assert value.dtype == (torch.float32 if key == "rewards" else torch.int64), key
    batch = ds.__getitems__([1, 0])
    assert {key: value.tolist() for key, value in batch.batched.items()} == {
        key: [EXPECTED[train_type][1][key], EXPECTED[train_type][0][key]] for key in EXPECTED[train_type][0]
    }


@pytest.mark.parametrize("store_format", sorted(FORMATS))
def test_stores_reopen_in_two_workers_through_both_collates(tmp_path, store_format):
    path = write_store(tmp_path, store_format, "dpo")
    ds = DatasetFactory.load("dpo", path, window_size=2, stride=1)  # 5 windows
    want = [as_lists(ds[i]) for i in range(len(ds))]
    for collate_fn in (None, collate):
        got = []
        for batch in DataLoader(ds, batch_size=2, num_workers=2, collate_fn=collate_fn):
            got += [{key: batch[key][row].tolist() for key in batch} for row in range(len(batch["chosen_labels"]))]
        assert got == want


@pytest.mark.parametrize("store_format", sorted(FORMATS))
def test_a_store_of_another_type_or_storage_type_is_a_named_error(tmp_path, store_format):
    path = write_store(tmp_path, store_format, "sft")
    with pytest.raises(MissingKeyError):
        DatasetFactory.load("dpo", path, window_size=2)
    other = "bin" if store_format == "h5" else "h5"
    with pytest.raises(DataError):
        DatasetFactory.load("sft", path, window_size=2, storage_type=other)
