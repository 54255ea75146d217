"""RecordStoreWriter: record stores whose keys have their own offsets (dpo sides, grpo groups)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tokenloom.formats import RecordStoreWriter, ShapeMismatchError, open_records


def _of(value, kind: type):
    assert isinstance(value, kind)
    return value


def array(record: dict[str, object], key: str) -> np.ndarray:
    """A plain key of a stored record: one array."""
    return _of(record[key], np.ndarray)


def arrays(record: dict[str, object], key: str) -> list[np.ndarray]:
    """A grouped key of a stored record (grpo responses, masks): one array per response."""
    return [_of(part, np.ndarray) for part in _of(record[key], list)]


def test_dpo_sides_of_different_lengths(tmp_path: Path) -> None:
    with RecordStoreWriter(tmp_path / "dpo", train_type="dpo", dtype="uint16", vocab_size=100) as writer:
        writer.add_record({"chosen": [1, 2, 3], "chosen_mask": [0, 1, 1], "rejected": [1, 4], "rejected_mask": [0, 1]})
        writer.add_record({"chosen": [5], "chosen_mask": [1], "rejected": [6, 7, 8, 9], "rejected_mask": [0, 0, 1, 1]})
    store = open_records(tmp_path / "dpo")
    assert len(store) == 2
    assert array(store.record(1), "rejected").tolist() == [6, 7, 8, 9]
    assert array(store.record(0), "chosen_mask").tolist() == [0, 1, 1]


def test_grpo_groups(tmp_path: Path) -> None:
    with RecordStoreWriter(tmp_path / "g", train_type="grpo", dtype="uint16", key_dtypes={"masks": "bool"}) as writer:
        writer.add_record({"prompts": [1, 2], "responses": [[3], [4, 5]], "masks": [[1], [1, 0]], "rewards": [0.5, 1]})
        writer.add_record({"prompts": [9], "responses": [[7, 7, 7]], "masks": [[1, 1, 1]], "rewards": [2]})
    store = open_records(tmp_path / "g")
    record = store.record(0)
    assert [r.tolist() for r in arrays(record, "responses")] == [[3], [4, 5]]
    assert [m.tolist() for m in arrays(record, "masks")] == [[True], [True, False]]
    assert array(store.record(1), "rewards").tolist() == [2.0]


@pytest.mark.parametrize(
    "record",
    [
        {"chosen": [1, 2], "chosen_mask": [1], "rejected": [1], "rejected_mask": [1]},
        {"prompts": [1], "responses": [[1]], "masks": [[1]], "rewards": [1, 2]},
        {"prompts": [1], "responses": [1], "masks": [[1]], "rewards": [1]},
        {"prompts": [1], "responses": [[1, 2]], "masks": [[1]], "rewards": [1]},
    ],
)
def test_misaligned_records_are_named_errors(tmp_path: Path, record: dict) -> None:
    train_type = "dpo" if "chosen" in record else "grpo"
    writer = RecordStoreWriter(tmp_path / "x", train_type=train_type, dtype="uint16")
    with pytest.raises(ShapeMismatchError) as caught:
        writer.add_record(record)
    assert caught.value.record == 0
    writer.abort()
    assert not (tmp_path / "x" / "meta.json").exists()


def test_sft_records_open_as_a_keyed_store_too(tmp_path: Path) -> None:
    from tokenloom.formats import open_store

    with RecordStoreWriter(tmp_path / "sft", train_type="sft", dtype="uint16") as writer:
        for n in (3, 5):
            writer.add_record(
                {"sequence": np.arange(n), "loss_mask": np.ones(n, dtype=np.uint8), "position_ids": np.arange(n)}
            )
    assert len(open_records(tmp_path / "sft")) == 2
    assert open_store(tmp_path / "sft").fetch(0, 8, "sequence").tolist() == [0, 1, 2, 0, 1, 2, 3, 4]


def test_inspect_records_without_a_tokenizer_shows_ids(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from tokenloom.formats.cli.commands import inspect

    with RecordStoreWriter(tmp_path / "sft", train_type="sft", dtype="uint16") as writer:
        writer.add_record({"sequence": [7, 8, 9, 10], "loss_mask": np.array([0, 0, 1, 1], dtype=np.uint8)})
    result = CliRunner().invoke(inspect, [str(tmp_path / "sft"), "--records", "5"])
    assert result.exit_code == 0, result.output
    assert "7 8 \u27e69 10\u27e7" in result.output and "mask share 50.0%" in result.output
    assert "token ids (no tokenizer" in result.output


def test_a_directory_with_a_writers_marker_does_not_open(tmp_path: Path) -> None:
    """A killed tokenize --train-type run leaves committed unit stores (each with meta.json) under the marker."""
    from tokenloom.formats import FormatError
    from tokenloom.formats.io import WRITING_MARKER

    with RecordStoreWriter(tmp_path / "out" / "unit_000000_0000.records", train_type="sft", dtype=np.uint16) as w:
        w.add_record({"sequence": np.array([1, 2, 3]), "loss_mask": np.array([0, 1, 1], dtype=np.uint8)})
    assert len(open_records(tmp_path / "out")) == 1  # a directory of stores opens as their union
    (tmp_path / "out" / WRITING_MARKER).touch()
    with pytest.raises(FormatError, match="a writer did not finish"):
        open_records(tmp_path / "out")
