"""Keyed stores (HDF5 and bin + meta.json): round trips per training type, fetch, bad input, processes."""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from formats_helpers import fuzz, refuses_link_and_fifo
from hypothesis import given
from hypothesis import strategies as st

from tokenloom.formats import (
    TRAIN_TYPE_KEYS,
    ConfigError,
    DataError,
    FormatError,
    IndexCorruptError,
    MissingFileError,
    MissingKeyError,
    RecordError,
    ResourceLimitError,
    ShapeMismatchError,
    StoreFactory,
    TokenRangeError,
    TruncatedError,
    UnsafePathError,
    detect_format,
    detect_store_type,
    open_dataset,
    open_store,
    open_writer,
)

if os.environ.get("TOKENLOOM_ISOLATED_ENV") == "formats":
    import h5py  # the formats tox env installs the h5 extra: these tests must not skip there
else:
    h5py = pytest.importorskip("h5py")

BACKENDS = [("h5", "store.h5"), ("bin-meta", "store")]


def sample_segments(train_type: str, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    segments = []
    for length in (3, 0, 5, 1):
        segment = {}
        for key in TRAIN_TYPE_KEYS[train_type]:
            if key == "rewards":
                segment[key] = rng.normal(size=length).astype(np.float32)
            elif "mask" in key:
                segment[key] = rng.integers(0, 2, size=length)
            else:
                segment[key] = rng.integers(0, 100, size=length)
        segments.append(segment)
    return segments


def write_store(path: Path, fmt: str, segments, **options) -> Path:
    with open_writer(path, format=fmt, dtype="uint16", vocab_size=100, **options) as writer:
        for segment in segments:
            writer.add_keyed(segment)
    return path


@pytest.mark.parametrize(("fmt", "name"), BACKENDS)
@pytest.mark.parametrize("train_type", sorted(TRAIN_TYPE_KEYS))
def test_round_trip_every_train_type(tmp_path: Path, fmt: str, name: str, train_type: str) -> None:
    segments = sample_segments(train_type, np.random.default_rng(0))
    path = write_store(tmp_path / name, fmt, segments, train_type=train_type)
    store = open_store(path, train_type=train_type)
    assert store.format == {"h5": "h5", "bin-meta": "bin"}[fmt] == detect_store_type(path)
    assert store.keys == sorted(TRAIN_TYPE_KEYS[train_type])
    assert store.train_type == train_type
    assert len(store) == 9
    assert store.record_offsets.tolist() == [0, 3, 3, 8, 9]
    whole = store.fetch(0, 9, store.keys)
    for key in store.keys:
        expected = np.concatenate([s[key] for s in segments])
        np.testing.assert_array_equal(whole[key], expected)
        np.testing.assert_array_equal(store.fetch(2, 7, key), expected[2:7])  # spans three segments
        np.testing.assert_array_equal(store.fetch(4, 6, key), expected[4:6])  # inside one
        assert len(store.fetch(5, 5, key)) == 0
    if train_type == "grpo":
        assert whole["rewards"].dtype == np.float32
    with pytest.raises(IndexError):
        store.fetch(0, 10, store.keys[0])


def test_astrai_h5_layout_orders_segments_numerically(tmp_path: Path, caplog) -> None:
    # astrai/dataset/storage.py save_h5 (ViperEkura/AstrAI): f.create_group(key); grp.create_dataset(f"data_{idx}")
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        group = f.create_group("sequence")
        for idx in range(12):
            group.create_dataset(f"data_{idx}", data=np.full(2, idx, dtype=np.int64))
    with caplog.at_level(logging.WARNING, logger="tokenloom.formats.keyed.h5"):
        store = open_store(path, "h5", train_type="seq")
    assert store.fetch(0, len(store), "sequence").tolist() == [i for i in range(12) for _ in range(2)]
    assert store.segment_lengths.tolist() == [2] * 12
    assert "AstrAI's H5Store iterated them in name order" in caplog.text  # its runs saw another order: said


def test_h5_writer_names_segments_so_that_name_order_is_write_order(tmp_path: Path, caplog) -> None:
    path = tmp_path / "w.h5"
    with open_writer(path, format="h5", dtype="uint16", vocab_size=100, eos_id=0) as writer:
        for i in range(12):
            writer.add(np.full(2, i + 1))
    with h5py.File(path, "r") as f:
        group: Any = f["sequence"]
        names = list(group.keys())  # h5py's order: what AstrAI's H5Store iterated
        by_name = np.concatenate([group[n][()] for n in names]).tolist()
    assert names == sorted(names) and names[0] == "data_000000000000"  # 12 digits: name order holds to 10^12
    assert by_name == [i + 1 for i in range(12) for _ in range(2)]
    with caplog.at_level(logging.WARNING, logger="tokenloom.formats.keyed.h5"):
        assert [int(e[0]) for e in open_dataset(path)] == list(range(1, 13))
    assert "name order" not in caplog.text


def test_astrai_bin_layout_with_several_directories(tmp_path: Path) -> None:
    # astrai serialization save_bin: meta.json {key: {"shape", "dtype"[, "offsets"]}}, raw <key>.bin per key
    for part, values in (("b", [4, 5]), ("a", [1, 2, 3])):
        directory = tmp_path / "s" / part
        directory.mkdir(parents=True)
        np.asarray(values, dtype=np.int64).tofile(directory / "sequence.bin")
        meta = {"sequence": {"shape": [len(values)], "dtype": "int64"}}
        (directory / "meta.json").write_bytes(orjson.dumps(meta))
    store = open_store(tmp_path / "s")
    assert store.fetch(0, 5, "sequence").tolist() == [1, 2, 3, 4, 5]
    assert store.fetch(1, 2, "sequence").base is not None  # a view into the memory map
    assert store.record_offsets.tolist() == [0, 3, 5]
    ds = open_dataset(tmp_path / "s", format="bin-meta")
    assert [ds[i].tolist() for i in range(len(ds))] == [[1, 2, 3], [4, 5]]


@pytest.mark.parametrize(("fmt", "name"), BACKENDS)
def test_seq_store_is_a_token_dataset(tmp_path: Path, fmt: str, name: str) -> None:
    with open_writer(tmp_path / name, format=fmt, dtype="uint16", vocab_size=100) as writer:
        for doc in ([1, 2, 0], [], [3, 0]):
            writer.add(doc)
    path = tmp_path / name
    assert detect_format(path) == fmt
    ds = open_dataset(path)
    assert [ds[i].tolist() for i in range(len(ds))] == [[1, 2, 0], [], [3, 0]]
    assert ds.dtype == np.uint16 and ds.num_tokens == 5
    with pytest.raises(ConfigError):
        open_dataset(path, dtype="uint32")


def test_chunked_h5_is_refused_as_a_token_dataset_but_fetchable(tmp_path: Path) -> None:
    path = tmp_path / "c.h5"
    with h5py.File(path, "w") as f:
        f.create_group("sequence").create_dataset("data_0", data=np.arange(10, dtype=np.uint16), compression="gzip")
    with pytest.raises(FormatError, match="memory-mapped"):
        open_dataset(path)
    assert open_store(path).fetch(3, 5, "sequence").tolist() == [3, 4]


# -- factory, loading, keys ---------------------------------------------------------------------


def test_factory_and_fetch_before_load() -> None:
    with pytest.raises(ConfigError, match=r"\['bin', 'h5'\]"):
        StoreFactory.create("parquet")
    store = StoreFactory.create("h5")
    with pytest.raises(DataError, match="not loaded") as info:
        store.fetch(0, 1, "sequence")
    assert not isinstance(info.value, RuntimeError)


@pytest.mark.parametrize(("fmt", "name"), BACKENDS)
def test_missing_keys_are_listed(tmp_path: Path, fmt: str, name: str) -> None:
    path = write_store(tmp_path / name, fmt, [{"sequence": [1, 2]}])
    with pytest.raises(MissingKeyError, match=r"the store has \['sequence'\]"):
        open_store(path, train_type="dpo")
    with pytest.raises(MissingKeyError, match="it has"):
        open_store(path).fetch(0, 1, ["sequence", "loss_mask"])


def test_writer_checks_keys_lengths_values(tmp_path: Path) -> None:
    writer = open_writer(tmp_path / "w.h5", format="h5", dtype="uint16", vocab_size=10, train_type="dpo")
    good = {"chosen": [1, 2], "rejected": [3], "chosen_mask": [1, 1], "rejected_mask": [1]}
    with pytest.raises(ShapeMismatchError, match="rejected"):
        writer.add_keyed(good)  # chosen (2) vs rejected (1): every key of a segment has one length
    with pytest.raises(MissingKeyError, match="expected"):
        writer.add_keyed({"chosen": [1]})
    with pytest.raises(TokenRangeError):
        writer.add_keyed({"chosen": [10], "rejected": [1], "chosen_mask": [1], "rejected_mask": [1]})
    with pytest.raises(ConfigError, match="add_keyed"):
        writer.add([1, 2])
    writer.abort()
    rewards = open_writer(tmp_path / "r.h5", format="h5", dtype="uint16", train_type="grpo")
    with pytest.raises(RecordError, match="finite"):
        rewards.add_keyed({"prompts": [1], "responses": [1], "masks": [1], "rewards": [float("nan")]})
    rewards.abort()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("fmt", "name"), BACKENDS)
def test_a_failed_write_leaves_no_store(tmp_path: Path, fmt: str, name: str) -> None:
    path = tmp_path / name
    with pytest.raises(RuntimeError), open_writer(path, format=fmt, dtype="uint16") as writer:
        writer.add_keyed({"sequence": [1, 2]})
        raise RuntimeError("killed")
    assert not path.exists() or list(path.iterdir()) == []
    assert not list(tmp_path.glob(f"{name}*.tmp"))
    with pytest.raises(DataError):
        open_store(path, "h5" if fmt == "h5" else "bin")


def h5_with(path: Path, groups: dict[str, list[np.ndarray]]) -> Path:
    with h5py.File(path, "w") as f:
        for key, segments in groups.items():
            group = f.create_group(key)
            for i, values in enumerate(segments):
                group.create_dataset(f"data_{i}", data=values)
    return path


def bin_with(path: Path, meta: dict, arrays: dict[str, np.ndarray]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for key, values in arrays.items():
        values.tofile(path / f"{key}.bin")
    (path / "meta.json").write_bytes(orjson.dumps(meta))
    return path


def test_unequal_keyed_segments(tmp_path: Path) -> None:
    h5 = h5_with(tmp_path / "a.h5", {"chosen": [np.arange(3)], "chosen_mask": [np.ones(2, np.uint8)]})
    with pytest.raises(ShapeMismatchError, match="segment 0"):
        open_store(h5)
    meta = {"chosen": {"shape": [3], "dtype": "int64"}, "chosen_mask": {"shape": [2], "dtype": "uint8"}}
    store = bin_with(tmp_path / "b", meta, {"chosen": np.arange(3), "chosen_mask": np.ones(2, np.uint8)})
    with pytest.raises(ShapeMismatchError, match="chosen"):
        open_store(store)
    meta = {
        "chosen": {"shape": [3], "dtype": "int64", "offsets": [0, 1, 3]},
        "chosen_mask": {"shape": [3], "dtype": "uint8", "offsets": [0, 2, 3]},
    }
    store = bin_with(tmp_path / "c", meta, {"chosen": np.arange(3), "chosen_mask": np.ones(3, np.uint8)})
    with pytest.raises(ShapeMismatchError, match="offsets"):
        open_store(store)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_rewards(tmp_path: Path, bad: float) -> None:
    rewards = np.array([0.5, bad, 1.0], dtype=np.float32)
    h5 = h5_with(tmp_path / "a.h5", {"rewards": [rewards]})
    with pytest.raises(RecordError, match="element 1"):
        open_store(h5)
    store = bin_with(tmp_path / "b", {"rewards": {"shape": [3], "dtype": "float32"}}, {"rewards": rewards})
    with pytest.raises(RecordError, match="finite"):
        open_store(store)
    assert len(open_store(store, validate="none")) == 3


def test_length_fields_over_the_cap(tmp_path: Path) -> None:
    meta = {"sequence": {"shape": [2**62], "dtype": "int64"}}
    store = bin_with(tmp_path / "b", meta, {"sequence": np.arange(3)})
    with pytest.raises(ResourceLimitError, match="cap"):
        open_store(store)
    h5 = h5_with(tmp_path / "a.h5", {"sequence": [np.arange(10)]})
    with pytest.raises(ResourceLimitError):
        open_store(h5, max_elements=5)


@pytest.mark.parametrize(
    ("meta", "error", "message"),
    [
        (b"{not json", FormatError, "JSON"),
        (orjson.dumps({"sequence": {"shape": [4], "dtype": "int64"}}), TruncatedError, "declares"),
        (orjson.dumps({"sequence": {"shape": [2], "dtype": "int64"}}), IndexCorruptError, "declares"),
        (orjson.dumps({"sequence": {"shape": [3, 1], "dtype": "int64"}}), FormatError, "1-D"),
        (orjson.dumps({"sequence": {"shape": [3], "dtype": "bfloat16"}}), FormatError, "dtype"),
        (
            orjson.dumps({"sequence": {"shape": [3], "dtype": "int64", "offsets": [0, 2, 1, 3]}}),
            IndexCorruptError,
            None,
        ),
        (orjson.dumps({"sequence": {"shape": [3], "dtype": "int64", "offsets": [1, 3]}}), IndexCorruptError, None),
        (orjson.dumps({"../../etc/passwd": {"shape": [3], "dtype": "int64"}}), UnsafePathError, "plain name"),
        (orjson.dumps({"loss_mask": {"shape": [3], "dtype": "int64"}}), MissingFileError, "missing"),
    ],
)
def test_bad_bin_stores(tmp_path: Path, meta: bytes, error: type, message: str | None) -> None:
    directory = tmp_path / "s"
    directory.mkdir()
    np.arange(3, dtype=np.int64).tofile(directory / "sequence.bin")
    (directory / "meta.json").write_bytes(meta)
    with pytest.raises(error, match=message):
        open_store(directory)


def test_symlinks_out_of_the_store_fifos_and_external_links(tmp_path: Path) -> None:
    outside = tmp_path / "outside.bin"
    np.arange(3, dtype=np.int64).tofile(outside)
    directory = tmp_path / "s"
    directory.mkdir()
    (directory / "meta.json").write_bytes(orjson.dumps({"sequence": {"shape": [3], "dtype": "int64"}}))
    refuses_link_and_fifo(directory / "sequence.bin", outside, lambda: open_store(directory), outside_match="outside")
    h5_with(tmp_path / "other.h5", {"sequence": [np.arange(3)]})
    with h5py.File(tmp_path / "linked.h5", "w") as f:
        f["sequence"] = h5py.ExternalLink("other.h5", "/sequence")
    with pytest.raises(UnsafePathError, match="ExternalLink"):
        open_store(tmp_path / "linked.h5")


def test_not_hdf5_and_unfinished_bin(tmp_path: Path) -> None:
    (tmp_path / "x.h5").write_bytes(b"not an hdf5 file at all")
    with pytest.raises(FormatError, match="HDF5"):
        open_store(tmp_path / "x.h5")
    writer = open_writer(tmp_path / "s", format="bin-meta", dtype="uint16")
    writer.add([1, 2])
    with pytest.raises(DataError):
        open_store(tmp_path / "s", "bin")
    writer.close()
    assert open_store(tmp_path / "s").fetch(0, 2, "sequence").tolist() == [1, 2]


def test_missing_h5py_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = h5_with(tmp_path / "a.h5", {"sequence": [np.arange(2)]})
    monkeypatch.setitem(sys.modules, "h5py", None)
    with pytest.raises(ImportError, match=r"tokenloom-formats\[h5\]"):
        open_store(path)


# -- processes ----------------------------------------------------------------------------------


def _fetch_in_child(store, queue) -> None:
    queue.put(store.fetch(0, len(store), "sequence").tolist())


@pytest.mark.parametrize(("fmt", "name"), BACKENDS)
def test_pickling_drops_handles_and_forked_children_reopen(tmp_path: Path, fmt: str, name: str) -> None:
    path = write_store(tmp_path / name, fmt, [{"sequence": [1, 2]}, {"sequence": [3]}])
    store = open_store(path)
    assert store.fetch(0, 3, "sequence").tolist() == [1, 2, 3]  # opens handles in this process
    state = pickle.loads(pickle.dumps(store))
    assert getattr(state, "_files", {}) == {} and getattr(state, "_maps", {}) == {}
    assert state.fetch(1, 3, "sequence").tolist() == [2, 3]
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_fetch_in_child, args=(store, queue))
    child.start()
    child.join(timeout=30)
    assert child.exitcode == 0
    assert queue.get(timeout=5) == [1, 2, 3]


# -- properties ---------------------------------------------------------------------------------


@fuzz(25)
@given(docs=st.lists(st.lists(st.integers(0, 999), max_size=10), max_size=6), fmt=st.sampled_from(["h5", "bin-meta"]))
def test_any_documents_round_trip_through_store_writers(tmp_path: Path, docs, fmt: str) -> None:
    path = tmp_path / ("p.h5" if fmt == "h5" else "p")
    with open_writer(path, format=fmt, dtype="uint16", vocab_size=1000, overwrite=True) as writer:
        for doc in docs:
            writer.add(doc)
    ds = open_dataset(path)
    assert [ds[i].tolist() for i in range(len(ds))] == docs
    store = open_store(path)
    assert store.fetch(0, len(store), "sequence").tolist() == [t for d in docs for t in d]


def test_every_truncation_of_a_bin_store_raises(tmp_path: Path) -> None:
    path = write_store(tmp_path / "s", "bin-meta", [{"sequence": [1, 2, 3]}, {"sequence": [4]}])
    for name in ("meta.json", "sequence.bin"):
        raw = (path / name).read_bytes()
        for length in range(len(raw)):
            (path / name).write_bytes(raw[:length])
            with pytest.raises(DataError):
                open_store(path)
        (path / name).write_bytes(raw)


def test_meta_json_flips_raise_or_stay_in_bounds(tmp_path: Path) -> None:
    path = write_store(tmp_path / "s", "bin-meta", [{"sequence": [1, 2, 3]}, {"sequence": [4]}])
    raw = (path / "meta.json").read_bytes()
    for position in range(len(raw)):
        data = bytearray(raw)
        data[position] ^= 0x01
        (path / "meta.json").write_bytes(bytes(data))
        try:
            store = open_store(path)
        except DataError:
            continue
        assert len(store.fetch(0, len(store), "sequence")) == len(store) <= 4


def test_h5_truncations_raise(tmp_path: Path) -> None:
    path = write_store(tmp_path / "a.h5", "h5", [{"sequence": [1, 2, 3]}])
    raw = path.read_bytes()
    cut = tmp_path / "cut.h5"
    for length in range(0, len(raw), max(1, len(raw) // 40)):
        cut.write_bytes(raw[:length])
        with pytest.raises(DataError):
            open_store(cut).fetch(0, 3, "sequence")
