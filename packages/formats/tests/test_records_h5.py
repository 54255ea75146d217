"""Record stores in HDF5 (AstrAI's H5 layout, a dataset per record): the same records as bin-meta."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from tokenloom.formats import DataError, FormatError, RecordStoreWriter, open_records
from tokenloom.formats.keyed import RecordH5Writer

h5py = pytest.importorskip("h5py")


def records(train_type: str, n: int = 25) -> list[dict]:
    rng = np.random.default_rng(7)
    out = []
    for i in range(n):
        if train_type == "sft":
            k = 1 + i % 9
            out.append({"sequence": rng.integers(0, 900, k), "loss_mask": rng.integers(0, 2, k).astype(bool),
                        "position_ids": np.arange(k)})  # fmt: skip
        elif train_type == "dpo":
            c, r = 1 + i % 5, 2 + i % 7
            out.append({"chosen": rng.integers(0, 900, c), "rejected": rng.integers(0, 900, r),
                        "chosen_mask": np.ones(c, bool), "rejected_mask": np.zeros(r, bool)})  # fmt: skip
        else:
            g = 1 + i % 3
            out.append({"prompts": rng.integers(0, 900, 4 + i % 3), "rewards": rng.normal(size=g),
                        "responses": [rng.integers(0, 900, 2 + j) for j in range(g)],
                        "masks": [np.ones(2 + j, bool) for j in range(g)]})  # fmt: skip
    return out


MASKS = {"loss_mask": "bool", "chosen_mask": "bool", "rejected_mask": "bool", "masks": "bool"}


@pytest.mark.parametrize("train_type", ["sft", "dpo", "grpo"])
def test_h5_records_equal_bin_meta_records(train_type: str, tmp_path: Path) -> None:
    for cls, path in ((RecordStoreWriter, tmp_path / "bin"), (RecordH5Writer, tmp_path / "h5" / "data.h5")):
        with cls(path, train_type=train_type, dtype="uint16", key_dtypes=MASKS) as writer:
            for record in records(train_type):
                writer.add_record(record)
    ours, theirs = open_records(tmp_path / "h5"), open_records(tmp_path / "bin")
    assert len(ours) == len(theirs) == 25 and ours.keys == theirs.keys
    assert len(open_records(tmp_path / "h5" / "data.h5")) == 25  # the file itself opens too
    for i in range(25):
        mine, base = ours.record(i), theirs.record(i)
        for key, value in base.items():
            got: Any = mine[key]
            pairs = zip(got, value, strict=True) if isinstance(value, list) else [(got, value)]
            for a, b in pairs:
                assert a.dtype == cast(Any, b).dtype and np.array_equal(a, cast(Any, b)), (i, key)
    # AstrAI's H5 layout: a group per key, a dataset per record, in name order
    with h5py.File(tmp_path / "h5" / "data.h5", "r") as handle:
        key = {"sft": "sequence", "dpo": "chosen", "grpo": "prompts"}[train_type]
        names = list(handle[key].keys())
        assert names == sorted(names) and len(names) == 25
        assert np.array_equal(handle[key][names[3]][()], cast(Any, theirs.record(3)[key]))


def test_a_bad_h5_record_store_is_a_format_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.h5"
    with h5py.File(path, "w") as handle:
        handle.create_dataset("sequence/data_000000000000", data=np.zeros((2, 2), np.int32))
    with pytest.raises(FormatError, match="1-D"):
        open_records(path)
    with h5py.File(path, "w") as handle:
        handle.create_dataset("rewards/data_000000000000", data=np.array([np.nan], np.float32))
    with pytest.raises(DataError, match="finite"):
        open_records(path)


def test_an_aborted_h5_writer_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "data.h5"
    writer = RecordH5Writer(path, train_type="sft", dtype="uint16", key_dtypes=MASKS)
    writer.add_record(records("sft")[0])
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_a_misshapen_h5_record_store_names_the_h5_file(tmp_path: Path) -> None:
    """Keys of different record counts (or a mask shorter than its tokens) in an .h5 store: the ShapeMismatchError
    names that .h5 file (it named a meta.json beside it, which an H5 store does not have); a string dataset says
    which dtypes are allowed (it said "is bytes16, expected bytes16")."""
    path = tmp_path / "bad.h5"
    with h5py.File(path, "w") as handle:
        handle.create_dataset("sequence/data_000000000000", data=np.array([1, 2], np.uint16))
        handle.create_dataset("sequence/data_000000000001", data=np.array([3], np.uint16))
        handle.create_dataset("loss_mask/data_000000000000", data=np.array([0, 1], bool))
    with pytest.raises(DataError, match="different record counts") as caught:
        open_records(path)
    assert caught.value.path == str(path)
    path.unlink()
    with h5py.File(path, "w") as handle:
        handle.create_dataset("chosen/data_000000000000", data=np.array([1, 2], np.uint16))
        handle.create_dataset("chosen_mask/data_000000000000", data=np.array([1], bool))
    with pytest.raises(DataError, match="the chosen_mask key differs in length") as caught:
        open_records(path)
    assert caught.value.path == str(path)
    path.unlink()
    with h5py.File(path, "w") as handle:
        handle.create_dataset("sequence/data_000000000000", data=np.array([b"ab"]))
    with pytest.raises(FormatError, match="bytes16, expected one of") as caught:
        open_records(path)


def test_validate_write_manifest_names_the_directory_for_an_h5_file_and_seals_the_directory(tmp_path: Path) -> None:
    """``validate FILE.h5 --write-manifest``: a ConfigError saying which directory to pass (it raised a bare
    NotADirectoryError); ``validate DIR --write-manifest`` on tokenize's h5 layout (data.h5 + post_training.json)
    writes manifest.json, whose checksums later opens verify."""
    from click.testing import CliRunner

    from tokenloom.formats import ChecksumError, read_manifest
    from tokenloom.formats.cli.commands import validate

    store = tmp_path / "sft"
    with RecordH5Writer(store / "data.h5", train_type="sft", dtype="uint16", key_dtypes=MASKS) as writer:
        for record in records("sft"):
            writer.add_record(record)
    (store / "post_training.json").write_text('{"train_type": "sft"}')
    result = CliRunner().invoke(validate, [str(store / "data.h5"), "--write-manifest"])
    assert result.exit_code == 1 and "ConfigError: data.h5 is a file" in result.output, result.output
    assert f"tokenloom validate {store} --write-manifest" in result.output
    assert "NotADirectoryError" not in result.output and not (store / "manifest.json").exists()
    result = CliRunner().invoke(validate, [str(store), "--write-manifest"])
    assert result.exit_code == 0 and "h5 (record store)" in result.output, result.output
    manifest = read_manifest(store)
    assert manifest.format == "h5" and [f.name for f in manifest.files] == ["data.h5", "post_training.json"]
    assert len(open_records(store)) == 25
    data = bytearray((store / "data.h5").read_bytes())
    data[-8] ^= 0xFF  # the last record's data
    (store / "data.h5").write_bytes(bytes(data))
    with pytest.raises(ChecksumError):
        open_records(store, validate="deep")
