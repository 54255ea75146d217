"""Training types over keyed stores: one hand-built store per type."""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from tokenloom.datasets import IGNORE_INDEX, ArrayStore, DatasetFactory, collate
from tokenloom.formats import ConfigError, MissingKeyError, ShapeMismatchError

X = IGNORE_INDEX


def test_seq_windows_and_stride():
    store = ArrayStore({"sequence": [10, 11, 12, 13, 14, 15, 16]})
    ds = DatasetFactory.load("seq", store, window_size=3)
    assert len(ds) == 2  # windows start at 0 and 3 (stride defaults to window_size)
    assert ds[0]["input_ids"].tolist() == [10, 11, 12]
    assert ds[0]["labels"].tolist() == [11, 12, 13]
    assert ds[1]["input_ids"].tolist() == [13, 14, 15]
    assert len(DatasetFactory.load("seq", store, window_size=3, stride=1)) == 4


def test_sft_masks_labels_where_the_loss_mask_is_zero():
    store = ArrayStore({"sequence": [1, 2, 3, 4, 5], "loss_mask": [0, 0, 1, 1, 0]})
    s = DatasetFactory.load("sft", store, window_size=4)[0]
    assert s["input_ids"].tolist() == [1, 2, 3, 4]
    assert s["labels"].tolist() == [X, 3, 4, X]
    assert s["loss_mask"].tolist() == [0, 1, 1, 0]


def test_dpo_has_both_sides():
    store = ArrayStore(
        {
            "chosen": [1, 2, 3, 4],
            "rejected": [1, 2, 7, 8],
            "chosen_mask": [0, 0, 1, 1],
            "rejected_mask": [0, 0, 1, 0],
        }
    )
    ds = DatasetFactory.load("dpo", store, window_size=3)
    s = ds[0]
    assert s["chosen_input_ids"].tolist() == [1, 2, 3]
    assert s["chosen_labels"].tolist() == [X, 3, 4]
    assert s["chosen_mask"].tolist() == [0, 1, 1]
    assert s["rejected_input_ids"].tolist() == [1, 2, 7]
    assert s["rejected_labels"].tolist() == [X, 7, X]
    batch = next(iter(DataLoader(ds, batch_size=1, collate_fn=collate)))
    assert batch["rejected_labels"].shape == (1, 3)


def test_grpo_reads_prompts_responses_masks_rewards():
    store = ArrayStore(
        {
            "prompts": [1, 2, 3, 4],
            "responses": [5, 6, 7, 8],
            "masks": [0, 1, 1, 1],
            "rewards": np.array([0.5, 0.5, -1.0, -1.0], dtype=np.float32),
        }
    )
    ds = DatasetFactory.load("grpo", store, window_size=2)
    assert len(ds) == 2
    s = ds[1]
    assert s["prompts"].tolist() == [3, 4]
    assert s["responses"].tolist() == [7, 8]
    assert s["masks"].tolist() == [1, 1]
    assert s["rewards"].dtype == torch.float32 and s["rewards"].tolist() == [-1.0, -1.0]


class RaggedStore:
    """A store whose loss_mask is shorter than its sequence (a broken preprocessing run)."""

    def __len__(self):
        return 6

    def fetch(self, begin, end, keys):
        data = {"sequence": np.arange(6), "loss_mask": np.ones(4, dtype=np.int64)}
        return {key: data[key][begin:end] for key in keys}


def test_mismatched_key_lengths_are_a_shape_mismatch():
    with pytest.raises(ShapeMismatchError, match="loss_mask"):
        DatasetFactory.load("sft", RaggedStore(), window_size=2)
    with pytest.raises(ShapeMismatchError):
        ArrayStore({"sequence": [1, 2, 3], "loss_mask": [1]})


def test_missing_keys_short_stores_and_bad_types():
    with pytest.raises(MissingKeyError):
        DatasetFactory.load("sft", ArrayStore({"sequence": [1, 2, 3]}), window_size=1)
    with pytest.raises(ConfigError, match="shorter than one window"):
        DatasetFactory.load("seq", ArrayStore({"sequence": [1, 2, 3]}), window_size=3)
    with pytest.raises(ConfigError, match="train_type"):
        DatasetFactory.load("ppo", ArrayStore({"sequence": [1, 2, 3]}), window_size=1)
    with pytest.raises(ConfigError, match="stride"):
        DatasetFactory.load("seq", ArrayStore({"sequence": [1, 2, 3]}), window_size=1, stride=0)


def test_real_bin_meta_stores_load_for_every_type(tmp_path):
    from tokenloom.formats.keyed import BinMetaStoreWriter

    segments = {
        "sft": [{"sequence": np.array([1, 2, 3, 4, 5]), "loss_mask": np.array([0, 0, 1, 1, 1], dtype=np.uint8)}],
        "dpo": [
            {
                "chosen": np.array([1, 2, 3, 4]),
                "rejected": np.array([1, 2, 7, 8]),
                "chosen_mask": np.array([0, 0, 1, 1], dtype=np.uint8),
                "rejected_mask": np.array([0, 0, 1, 1], dtype=np.uint8),
            }
        ],
        "grpo": [
            {
                "prompts": np.array([1, 2, 3]),
                "responses": np.array([4, 5, 6]),
                "masks": np.array([0, 1, 1], dtype=np.uint8),
                "rewards": np.array([1.0, 1.0, 0.5], dtype=np.float32),
            },
            {
                "prompts": np.array([9]),
                "responses": np.array([8]),
                "masks": np.array([1], dtype=np.uint8),
                "rewards": np.array([-1.0], dtype=np.float32),
            },
        ],
    }
    for kind, parts in segments.items():
        path = tmp_path / kind
        with BinMetaStoreWriter(path, dtype="uint16", vocab_size=100, train_type=kind) as writer:
            for part in parts:
                writer.add_keyed(part)
        ds = DatasetFactory.load(kind, path, window_size=3 if kind != "grpo" else 2, stride=2)
        loader = DataLoader(ds, batch_size=2, num_workers=2, collate_fn=collate)
        batches = list(loader)
        assert sum(len(next(iter(b.values()))) for b in batches) == len(ds)
    sft = DatasetFactory.load("sft", tmp_path / "sft", window_size=4)[0]
    assert sft["labels"].tolist() == [X, 3, 4, 5]
    grpo = DatasetFactory.load("grpo", tmp_path / "grpo", window_size=2, stride=2)
    assert grpo[1]["prompts"].tolist() == [3, 9]  # windows run across segments
    assert grpo[1]["rewards"].tolist() == [0.5, -1.0]
    with pytest.raises(MissingKeyError):
        DatasetFactory.load("dpo", tmp_path / "sft", window_size=2)
