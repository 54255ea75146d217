"""AstrAI fidelity: SFT position_ids and DPO mask alignment, pinned by hand-computed cases.

Fixtures follow AstrAI's documented bin layout (astrai/serialization/dataset.py,
``save_bin``): one raw ``<key>.bin`` per key and ``meta.json`` with, per key,
``shape``, ``dtype`` (torch's name) and optional record ``offsets``. AstrAI's
SFTDataset reads ``sequence``, ``loss_mask`` and ``position_ids`` and returns
``input_ids = sequence[b:e]``, ``target_ids = sequence[b+1:e+1]``,
``position_ids = position_ids[b:e]``, ``loss_mask = loss_mask[b+1:e+1]``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tokenloom.datasets import IGNORE_INDEX, ArrayStore, DatasetFactory
from tokenloom.formats import ConfigError, open_writer

X = IGNORE_INDEX
SEQUENCE = [11, 12, 13, 2, 21, 22, 23, 24, 2]
LOSS_MASK = [0, 1, 1, 1, 0, 0, 1, 1, 1]
POSITIONS = [0, 1, 2, 3, 0, 1, 2, 3, 4]  # reset per document, as AstrAI's doc_reset mode writes


def save_bin_like_astrai(root: Path, arrays: dict[str, tuple[list, str]]) -> Path:
    root.mkdir(parents=True)
    meta = {}
    for key, (values, dtype) in arrays.items():
        np.asarray(values, dtype=dtype).tofile(root / f"{key}.bin")
        meta[key] = {"shape": [len(values)], "dtype": dtype}
    (root / "meta.json").write_text(json.dumps(meta))
    return root


def astrai_sft_sample(begin: int, window: int) -> dict[str, list]:
    end = begin + window
    return {
        "input_ids": SEQUENCE[begin:end],
        "target_ids": SEQUENCE[begin + 1 : end + 1],
        "position_ids": POSITIONS[begin:end],
        "loss_mask": LOSS_MASK[begin + 1 : end + 1],
    }


def test_sft_reads_astrai_position_ids(tmp_path: Path) -> None:
    path = save_bin_like_astrai(
        tmp_path / "sft",
        {"sequence": (SEQUENCE, "int32"), "loss_mask": (LOSS_MASK, "bool"), "position_ids": (POSITIONS, "int64")},
    )
    ds = DatasetFactory.load("sft", path, window_size=4)
    assert len(ds) == 2  # AstrAI: (9 - 1 - 4) // 4 + 1
    for i in range(len(ds)):
        ours, theirs = ds[i], astrai_sft_sample(4 * i, 4)
        assert ours["input_ids"].tolist() == theirs["input_ids"]
        assert ours["position_ids"].tolist() == theirs["position_ids"]
        assert ours["loss_mask"].tolist() == theirs["loss_mask"]
        assert ours["labels"].tolist() == [
            t if m else X for t, m in zip(theirs["target_ids"], theirs["loss_mask"], strict=True)
        ]
    assert ds[1]["position_ids"].tolist() == [0, 1, 2, 3]
    assert ds[0]["labels"].tolist() == [12, 13, 2, X]


def test_sft_without_position_ids_counts_from_zero_in_every_sample() -> None:
    ds = DatasetFactory.load("sft", ArrayStore({"sequence": SEQUENCE, "loss_mask": LOSS_MASK}), window_size=4)
    assert [ds[i]["position_ids"].tolist() for i in range(len(ds))] == [[0, 1, 2, 3], [0, 1, 2, 3]]


def test_tokenloom_writes_sft_stores_astrai_reads(tmp_path: Path) -> None:
    with open_writer(tmp_path / "sft", format="bin-meta", dtype="uint16", vocab_size=100, train_type="sft") as w:
        w.add_keyed({"sequence": SEQUENCE[:4], "loss_mask": LOSS_MASK[:4], "position_ids": POSITIONS[:4]})
        w.add_keyed({"sequence": SEQUENCE[4:], "loss_mask": LOSS_MASK[4:], "position_ids": POSITIONS[4:]})
    meta = json.loads((tmp_path / "sft" / "meta.json").read_text())
    assert sorted(meta) == ["loss_mask", "position_ids", "sequence"]  # AstrAI's required_keys
    # read exactly as AstrAI's load_bin does: np.memmap(<key>.bin, dtype=meta dtype, shape=meta shape)
    arrays = {
        key: np.memmap(tmp_path / "sft" / f"{key}.bin", dtype=info["dtype"], mode="r", shape=tuple(info["shape"]))
        for key, info in meta.items()
    }
    assert arrays["sequence"].tolist() == SEQUENCE
    assert arrays["position_ids"].tolist() == POSITIONS
    assert arrays["loss_mask"].tolist() == LOSS_MASK
    assert meta["position_ids"]["offsets"] == [0, 4, 9]
    assert DatasetFactory.load("sft", tmp_path / "sft", window_size=4)[1]["position_ids"].tolist() == [0, 1, 2, 3]


def test_sft_writer_needs_position_ids_in_every_record_once_given(tmp_path: Path) -> None:
    from tokenloom.formats import MissingKeyError

    with (
        pytest.raises(MissingKeyError, match="expected \\['loss_mask', 'position_ids', 'sequence'\\]"),
        open_writer(tmp_path / "sft", format="bin-meta", dtype="uint16", train_type="sft") as w,
    ):
        w.add_keyed({"sequence": [1, 2], "loss_mask": [1, 1], "position_ids": [0, 1]})
        w.add_keyed({"sequence": [1, 2], "loss_mask": [1, 1]})


DPO = {
    "chosen": [1, 2, 3, 4, 5],
    "rejected": [1, 2, 7, 8, 9],
    "chosen_mask": [0, 0, 1, 1, 1],
    "rejected_mask": [0, 0, 1, 1, 0],
}


def test_dpo_mask_alignment_labels_and_inputs() -> None:
    by_labels = DatasetFactory.load("dpo", ArrayStore(DPO), window_size=4)[0]
    by_inputs = DatasetFactory.load("dpo", ArrayStore(DPO), window_size=4, mask_alignment="inputs")[0]
    for sample in (by_labels, by_inputs):
        assert sample["chosen_input_ids"].tolist() == [1, 2, 3, 4]
        assert sample["chosen_labels"].tolist() == [X, 3, 4, 5]
        assert sample["rejected_labels"].tolist() == [X, 7, 8, X]
    assert by_labels["chosen_mask"].tolist() == [0, 1, 1, 1]  # mask[t] goes with labels[t]
    assert by_labels["rejected_mask"].tolist() == [0, 1, 1, 0]
    assert by_inputs["chosen_mask"].tolist() == [0, 0, 1, 1]  # mask[t] goes with input_ids[t] (AstrAI)
    assert by_inputs["rejected_mask"].tolist() == [0, 0, 1, 1]


def test_unknown_mask_alignment() -> None:
    with pytest.raises(ConfigError, match="mask_alignment 'outputs', expected one of \\['labels', 'inputs'\\]"):
        DatasetFactory.load("dpo", ArrayStore(DPO), window_size=4, mask_alignment="outputs")


def test_sft_position_ids_in_an_h5_store(tmp_path: Path) -> None:
    pytest.importorskip("h5py")
    with open_writer(tmp_path / "sft.h5", format="h5", dtype="uint16", vocab_size=100, train_type="sft") as w:
        w.add_keyed({"sequence": SEQUENCE, "loss_mask": LOSS_MASK, "position_ids": POSITIONS})
    ds = DatasetFactory.load("sft", tmp_path / "sft.h5", window_size=4)
    assert [ds[i]["position_ids"].tolist() for i in range(len(ds))] == [POSITIONS[0:4], POSITIONS[4:8]]
    assert ds[1]["input_ids"].tolist() == SEQUENCE[4:8]
