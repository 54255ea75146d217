"""Review of issue 36's keyed record-length check (one loop over (tokens, mask) pairs): GRPO stores with damaged
offsets or without rewards are named errors that point at the right record; DPO sides are checked the same way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenloom.formats import RecordStoreWriter, ShapeMismatchError, open_records
from tokenloom.formats.errors import DataError


def _grpo(root: Path) -> Path:
    """Record 0: one response; record 1: three responses (lengths 1, 2, 3)."""
    with RecordStoreWriter(root, train_type="grpo", dtype="uint16", key_dtypes={"masks": "bool"}) as writer:
        writer.add_record({"prompts": [1, 2], "responses": [[3]], "masks": [[1]], "rewards": [0.5]})
        writer.add_record(
            {
                "prompts": [9],
                "responses": [[7], [7, 7], [7, 7, 7]],
                "masks": [[1], [1, 1], [1, 1, 1]],
                "rewards": [1, 2, 3],
            }
        )
    (root / "manifest.json").unlink()  # the meta.json edits below would first be a (right) ChecksumError
    return root


def _edit(root: Path, change) -> None:
    meta = json.loads((root / "meta.json").read_text())
    change(meta)
    (root / "meta.json").write_text(json.dumps(meta))


def test_an_intact_grpo_store_opens(tmp_path: Path) -> None:
    store = open_records(_grpo(tmp_path / "g"))
    assert len(store) == 2


def test_a_grpo_mask_length_error_names_the_record_not_the_response(tmp_path: Path) -> None:
    root = _grpo(tmp_path / "g")
    # responses offsets [0,1,2,4,7]: the third and fourth responses (both in record 1) get masks of 3 and 2
    _edit(root, lambda m: m["masks"].update(offsets=[0, 1, 2, 5, 7]))
    with pytest.raises(ShapeMismatchError) as caught:
        open_records(root)
    assert caught.value.field == "masks"
    assert caught.value.record == 1, str(caught.value)  # observed: 2 (the response index), past the 2 records


def test_grpo_without_rewards_is_a_named_count_error(tmp_path: Path) -> None:
    root = _grpo(tmp_path / "g")
    _edit(root, lambda m: m.pop("rewards"))
    (root / "rewards.bin").unlink()
    with pytest.raises(ShapeMismatchError, match="different record counts"):
        open_records(root)


def test_grpo_rewards_announcing_other_response_counts_are_named(tmp_path: Path) -> None:
    root = _grpo(tmp_path / "g")
    _edit(root, lambda m: m["rewards"].update(offsets=[0, 1, 3]))  # 3 rewards offsets for 4 stored values
    with pytest.raises(DataError, match="rewards"):
        open_records(root)


@pytest.mark.parametrize("side", ["chosen", "rejected"])
def test_a_dpo_mask_of_another_length_is_named(tmp_path: Path, side: str) -> None:
    root = tmp_path / "dpo"
    with RecordStoreWriter(root, train_type="dpo", dtype="uint16", vocab_size=100) as writer:
        writer.add_record({"chosen": [1, 2], "chosen_mask": [0, 1], "rejected": [1, 4], "rejected_mask": [0, 1]})
        writer.add_record({"chosen": [5, 6], "chosen_mask": [1, 1], "rejected": [6, 7], "rejected_mask": [0, 1]})
    (root / "manifest.json").unlink()
    _edit(root, lambda m: m[f"{side}_mask"].update(offsets=[0, 1, 4]))
    with pytest.raises(ShapeMismatchError) as caught:
        open_records(root)
    assert caught.value.field == f"{side}_mask" and caught.value.record == 0
    assert f"the {side}_mask key differs in length from the {side} key" in str(caught.value)
