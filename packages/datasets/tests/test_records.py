"""Record-mode dpo / grpo (AstrAI's current DPODataset / GRPODataset) over bin + meta.json with offsets.

DPO fixtures are written as AstrAI's ``save_bin(path, tensors, record_keys=...)``
writes them (astrai/serialization/dataset.py): per key the concatenated records
in ``<key>.bin`` and ``{"shape", "dtype", "offsets"}`` in meta.json, torch dtype
names. AstrAI's bin cannot hold GRPO's nested responses; the GRPO fixture uses the
grouped layout tokenloom documents (tokenloom.formats.keyed.records).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tokenloom.datasets import DatasetFactory, RecordDataset
from tokenloom.formats import ConfigError, FormatError, MissingKeyError, RecordError, ShapeMismatchError, open_records


def save_bin_with_records(root: Path, groups: dict[str, tuple[list[list], str]]) -> Path:
    """AstrAI's save_bin with every key a record key: concatenation + cumulative offsets."""
    root.mkdir(parents=True, exist_ok=True)
    meta = {}
    for key, (records, dtype) in groups.items():
        flat = np.asarray([v for record in records for v in record], dtype=dtype)
        flat.tofile(root / f"{key}.bin")
        offsets = np.concatenate([[0], np.cumsum([len(r) for r in records])]).astype(int).tolist()
        meta[key] = {"shape": [len(flat)], "dtype": dtype, "offsets": offsets}
    (root / "meta.json").write_text(json.dumps(meta))
    return root


CHOSEN = [[1, 2, 3, 4], [1, 5, 6], [9, 8, 7, 6, 5, 4]]
REJECTED = [[1, 2, 7], [1, 5, 6, 6, 6], [9, 8, 1]]
CHOSEN_MASK = [[0, 0, 1, 1], [0, 1, 1], [0, 0, 0, 1, 1, 1]]
REJECTED_MASK = [[0, 0, 1], [0, 1, 1, 1, 1], [0, 0, 1]]


DPO_COLUMNS = {
    "chosen": (CHOSEN, "int32"),
    "rejected": (REJECTED, "int32"),
    "chosen_mask": (CHOSEN_MASK, "bool"),
    "rejected_mask": (REJECTED_MASK, "bool"),
}


def dpo_store(root: Path) -> Path:
    return save_bin_with_records(root, DPO_COLUMNS)


def test_dpo_records_are_astrai_samples(tmp_path: Path) -> None:
    ds = DatasetFactory.load("dpo", dpo_store(tmp_path / "dpo"))  # no window_size: record mode, as AstrAI
    assert isinstance(ds, RecordDataset) and len(ds) == 3
    for i in range(3):
        sample = ds[i]
        assert sorted(sample) == ["chosen", "chosen_mask", "rejected", "rejected_mask"]
        assert sample["chosen"].dtype == torch.int64 and sample["chosen_mask"].dtype == torch.bool
        assert sample["chosen"].tolist() == CHOSEN[i]
        assert sample["rejected"].tolist() == REJECTED[i]
        assert sample["chosen_mask"].tolist() == [bool(v) for v in CHOSEN_MASK[i]]
        assert sample["rejected_mask"].tolist() == [bool(v) for v in REJECTED_MASK[i]]
    assert ds[-1]["chosen"].tolist() == CHOSEN[-1]
    with pytest.raises(IndexError):
        ds[3]


def test_records_across_sub_directories(tmp_path: Path) -> None:
    dpo_store(tmp_path / "dpo" / "a")
    dpo_store(tmp_path / "dpo" / "b")
    ds = DatasetFactory.load("dpo", tmp_path / "dpo")
    assert len(ds) == 6
    assert ds[4]["rejected"].tolist() == REJECTED[1]


PROMPTS = [[1, 2, 3], [4, 5]]
RESPONSES = [[10, 11], [12], [13, 14, 15], [20], [21, 22]]  # G = 3 for prompt 0, 2 for prompt 1
MASKS = [[1, 1], [1], [1, 1, 0], [1], [0, 1]]
REWARDS = [[0.5, -1.0, 2.0], [1.0, 0.0]]


def grpo_store(root: Path, rewards=REWARDS) -> Path:
    columns = {"prompts": (PROMPTS, "int32"), "responses": (RESPONSES, "int32"), "masks": (MASKS, "bool")}
    return save_bin_with_records(root, {**columns, "rewards": (rewards, "float32")})


def test_grpo_records_group_g_responses_per_prompt(tmp_path: Path) -> None:
    ds = DatasetFactory.load("grpo", grpo_store(tmp_path / "grpo"))
    assert len(ds) == 2
    first, second = ds[0], ds[1]
    assert first["prompts"].tolist() == [1, 2, 3]
    assert [r.tolist() for r in first["responses"]] == RESPONSES[:3]
    assert [m.tolist() for m in first["masks"]] == [[True, True], [True], [True, True, False]]
    assert first["rewards"].dtype == torch.float32 and first["rewards"].tolist() == [0.5, -1.0, 2.0]
    assert [r.tolist() for r in second["responses"]] == RESPONSES[3:]
    assert second["rewards"].tolist() == [1.0, 0.0]


def test_record_mode_bad_input(tmp_path: Path) -> None:
    path = dpo_store(tmp_path / "counts")
    meta = json.loads((path / "meta.json").read_text())
    meta["rejected"]["offsets"] = [0, 8, 11]
    meta["rejected_mask"]["offsets"] = [0, 8, 11]
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ShapeMismatchError, match="different record counts"):
        open_records(path)

    path = dpo_store(tmp_path / "mask")
    meta = json.loads((path / "meta.json").read_text())
    meta["chosen_mask"]["offsets"] = [0, 3, 7, 13]
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ShapeMismatchError, match="the chosen_mask key differs in length from the chosen key") as info:
        open_records(path)
    assert info.value.record == 0

    path = dpo_store(tmp_path / "no-offsets")
    meta = json.loads((path / "meta.json").read_text())
    del meta["chosen"]["offsets"]
    (path / "meta.json").write_text(json.dumps(meta))
    store = open_records(path)  # chosen is a stream key now, as in AstrAI's MmapStore
    assert store.stream_keys == ["chosen"] and "chosen" not in store.keys
    with pytest.raises(MissingKeyError, match=r"reads \['chosen'\] as records, but meta.json gives it no offsets"):
        DatasetFactory.load("dpo", path)
    for info in meta.values():
        info.pop("offsets", None)
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(FormatError, match="has offsets: not a record store"):
        open_records(path)

    path = grpo_store(tmp_path / "groups", rewards=[[0.5, -1.0], [1.0, 0.0]])
    with pytest.raises(ShapeMismatchError, match="(masks|responses) has 5 records, the rewards announce 4 responses"):
        open_records(path)

    path = grpo_store(tmp_path / "nan", rewards=[[0.5, float("nan"), 2.0], [1.0, 0.0]])
    with pytest.raises(RecordError):
        open_records(path)

    with pytest.raises(MissingKeyError, match="needs keys"):
        DatasetFactory.load("grpo", dpo_store(tmp_path / "wrong-type"))
    with pytest.raises(ConfigError, match="sft needs window_size"):
        DatasetFactory.load("sft", tmp_path / "counts")


def test_records_reopen_in_dataloader_workers(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    ds = DatasetFactory.load("dpo", dpo_store(tmp_path / "dpo"))
    ds[0]  # map the files in this process first: workers must reopen them, not inherit the maps
    loader = DataLoader(ds, batch_size=2, num_workers=2, collate_fn=list, timeout=60)
    seen = [sample["chosen"].tolist() for batch in loader for sample in batch]
    assert seen == CHOSEN
