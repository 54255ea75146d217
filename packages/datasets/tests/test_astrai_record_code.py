"""Record-mode DPO/GRPO against what AstrAI's code does (ViperEkura/AstrAI at 75304d0).

The fixtures follow ``astrai/serialization/dataset.py`` ``save_bin`` step by step,
with torch tensors as AstrAI passes them: per key ``torch.cat`` of the records,
``"dtype": str(cat.dtype).split(".")[-1]``, ``"offsets"`` only for the keys in
``record_keys``, ``cat.numpy().tofile(<key>.bin)``. The expected samples are what
``astrai/dataset/dataset.py`` ``DPODataset.__getitem__`` returns for that store
(``store.fetch_record(i, key)`` = ``data[offsets[i]:offsets[i + 1]]``, then
``.to(torch.long)`` / ``.to(torch.bool)``), computed by hand below.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from tokenloom.datasets import DatasetFactory, RecordDataset
from tokenloom.formats import open_records


def astrai_save_bin(path: Path, tensor_group: dict[str, list[torch.Tensor]], record_keys: list[str]) -> Path:
    """What AstrAI's save_bin writes (its steps, in its order)."""
    path.mkdir(parents=True, exist_ok=True)
    meta = {}
    for key, tensors in tensor_group.items():
        cat = torch.cat(tensors, dim=0)
        entry: dict[str, object] = {"shape": list(cat.shape), "dtype": str(cat.dtype).split(".")[-1]}
        if key in record_keys:
            offsets = [0]
            for tensor in tensors:
                offsets.append(offsets[-1] + tensor.shape[0])
            entry["offsets"] = offsets
        meta[key] = entry
        np.asarray(cat.cpu().numpy()).tofile(path / f"{key}.bin")
    (path / "meta.json").write_text(json.dumps(meta))
    return path


# dpo_processor's dtypes: int32 tokens, bool masks; record 1 has an empty rejected side
DPO = {
    "chosen": [torch.tensor([5, 6, 7], dtype=torch.int32), torch.tensor([8, 9], dtype=torch.int32)],
    "rejected": [torch.tensor([5, 6, 1, 2], dtype=torch.int32), torch.tensor([], dtype=torch.int32)],
    "chosen_mask": [torch.tensor([False, True, True]), torch.tensor([False, True])],
    "rejected_mask": [torch.tensor([False, True, True, True]), torch.tensor([], dtype=torch.bool)],
    # a key AstrAI writes without offsets (not in record_keys): a stream its DPODataset never reads
    "sequence": [torch.tensor([1, 2, 3, 4, 5, 6, 7], dtype=torch.int64)],
}
RECORD_KEYS = ["chosen", "rejected", "chosen_mask", "rejected_mask"]


def test_the_fixture_is_astrais_layout(tmp_path: Path) -> None:
    path = astrai_save_bin(tmp_path / "dpo", DPO, RECORD_KEYS)
    meta = json.loads((path / "meta.json").read_text())
    assert meta["chosen"] == {"shape": [5], "dtype": "int32", "offsets": [0, 3, 5]}
    assert meta["rejected"] == {"shape": [4], "dtype": "int32", "offsets": [0, 4, 4]}
    assert meta["chosen_mask"] == {"shape": [5], "dtype": "bool", "offsets": [0, 3, 5]}
    assert meta["sequence"] == {"shape": [7], "dtype": "int64"}
    assert (path / "chosen.bin").read_bytes() == np.array([5, 6, 7, 8, 9], dtype="<i4").tobytes()
    assert (path / "rejected_mask.bin").read_bytes() == bytes([0, 1, 1, 1])


def test_dpo_samples_are_what_astrais_dpo_dataset_returns(tmp_path: Path) -> None:
    path = astrai_save_bin(tmp_path / "dpo", DPO, RECORD_KEYS)
    ds = DatasetFactory.load("dpo", path)  # AstrAI: DatasetFactory.load("dpo", path), window_size ignored
    assert isinstance(ds, RecordDataset) and len(ds) == 2  # AstrAI: min over record keys of len(offsets) - 1
    expected = [
        {
            "chosen": ([5, 6, 7], torch.long),
            "rejected": ([5, 6, 1, 2], torch.long),
            "chosen_mask": ([False, True, True], torch.bool),
            "rejected_mask": ([False, True, True, True], torch.bool),
        },
        {
            "chosen": ([8, 9], torch.long),
            "rejected": ([], torch.long),
            "chosen_mask": ([False, True], torch.bool),
            "rejected_mask": ([], torch.bool),
        },
    ]
    for i, want in enumerate(expected):
        sample = ds[i]
        assert sorted(sample) == sorted(want)  # the stream key "sequence" is not part of a sample
        for key, (values, dtype) in want.items():
            assert sample[key].dtype == dtype, key
            assert sample[key].tolist() == values, key
    store = open_records(path)
    assert store.keys == sorted(RECORD_KEYS) and store.stream_keys == ["sequence"]


def test_dpo_with_window_size_is_still_record_mode_as_in_astrai(tmp_path: Path) -> None:
    # AstrAI's _store_window_for: dpo/grpo stores are built with window_size=0 whatever is passed, and its
    # train script always passes window_size; a store whose keys differ in length cannot be windowed
    path = astrai_save_bin(tmp_path / "dpo", DPO, RECORD_KEYS)
    ds = DatasetFactory.load("dpo", path, window_size=4, stride=2)
    assert isinstance(ds, RecordDataset) and len(ds) == 2
    assert ds[0]["rejected"].tolist() == [5, 6, 1, 2] and ds[1]["chosen"].tolist() == [8, 9]


def test_astrai_refuses_nested_grpo_keys_in_bin_so_grpo_uses_tokenloom_layout(tmp_path: Path) -> None:
    # AstrAI's save_bin raises ValueError on a List[List[Tensor]] key (GRPO's G responses per prompt),
    # so AstrAI has no bin layout for GRPO and keeps it in JSONL.
    # tokenloom's grouped layout: responses/masks one record per response, rewards G values per prompt
    path = astrai_save_bin(
        tmp_path / "grpo",
        {
            "prompts": [torch.tensor([1, 2], dtype=torch.int32), torch.tensor([3], dtype=torch.int32)],
            "responses": [torch.tensor(r, dtype=torch.int32) for r in ([4], [5, 6], [7, 8, 9])],
            "masks": [torch.tensor([True]), torch.tensor([True, False]), torch.tensor([False, True, True])],
            "rewards": [torch.tensor([0.5, -0.5]), torch.tensor([2.0])],
        },
        ["prompts", "responses", "masks", "rewards"],
    )
    ds = DatasetFactory.load("grpo", path)
    assert len(ds) == 2
    first, second = ds[0], ds[1]
    # AstrAI's GRPODataset sample: prompts long, responses [G] long, masks [G] bool, rewards float32 [G]
    assert first["prompts"].dtype == torch.long and first["prompts"].tolist() == [1, 2]
    assert [r.tolist() for r in first["responses"]] == [[4], [5, 6]]
    assert all(r.dtype == torch.long for r in first["responses"])
    assert [m.tolist() for m in first["masks"]] == [[True], [True, False]]
    assert first["rewards"].dtype == torch.float32 and first["rewards"].tolist() == [0.5, -0.5]
    assert [r.tolist() for r in second["responses"]] == [[7, 8, 9]] and second["rewards"].tolist() == [2.0]


def test_equal_length_records_with_window_size_are_windows_with_a_warning(tmp_path: Path, caplog) -> None:
    # chosen and rejected padded alike: on disk this is both AstrAI's records and tokenloom's segmented
    # stream; window_size asks for windows (tokenloom's writer stores segments the same way), and the
    # warning names what AstrAI would serve and how to get it here
    same = {
        "chosen": [torch.tensor([1, 2], dtype=torch.int32), torch.tensor([3, 4], dtype=torch.int32)],
        "rejected": [torch.tensor([5, 6], dtype=torch.int32), torch.tensor([7, 8], dtype=torch.int32)],
        "chosen_mask": [torch.tensor([True, True]), torch.tensor([False, True])],
        "rejected_mask": [torch.tensor([True, True]), torch.tensor([True, False])],
    }
    path = astrai_save_bin(tmp_path / "dpo", same, RECORD_KEYS)
    with caplog.at_level("WARNING"):
        windows = DatasetFactory.load("dpo", path, window_size=1)
    assert not isinstance(windows, RecordDataset)
    assert "AstrAI records" in caplog.text and "window_size=None for records" in caplog.text
    records = DatasetFactory.load("dpo", path)
    assert isinstance(records, RecordDataset) and records[1]["chosen"].tolist() == [3, 4]
