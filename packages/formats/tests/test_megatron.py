"""Megatron MMIDIDX indexed datasets: round trip, path forms, hand-built indices, corruption."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from formats_helpers import entries, flip_drawn_bit, fuzz, refused_after, truncate_drawn, write_docs
from hypothesis import given
from hypothesis import strategies as st

from tokenloom.formats import detect_format, errors, open_dataset, open_writer

DOCS = [[5, 6, 0], [7, 0], [], [8, 9, 10, 11, 0]]
CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6, "float32": 7, "uint16": 8}


def build(
    prefix: Path,
    sequences,
    *,
    dtype: str = "uint16",
    document_indices=None,
    modes=None,
) -> None:
    """An MMIDIDX pair written from the byte layout (independently of tokenloom's writer)."""
    arrays = [np.asarray(s, dtype=dtype) for s in sequences]
    sizes = np.array([len(a) for a in arrays], dtype="<i4")
    pointers = np.concatenate([[0], np.cumsum(sizes.astype(np.int64))[:-1]]) * np.dtype(dtype).itemsize
    documents = np.arange(len(arrays) + 1) if document_indices is None else np.asarray(document_indices)
    header = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, CODES[dtype], len(arrays), len(documents))
    body = sizes.tobytes() + pointers.astype("<i8").tobytes() + documents.astype("<i8").tobytes()
    if modes is not None:
        body += np.asarray(modes, dtype=np.int8).tobytes()
    prefix.with_name(prefix.name + ".idx").write_bytes(header + body)
    data = b"".join(a.astype(np.dtype(dtype).newbyteorder("<")).tobytes() for a in arrays)
    prefix.with_name(prefix.name + ".bin").write_bytes(data)


def write(prefix: Path, docs, dtype: str = "uint16") -> None:
    write_docs(prefix, "megatron", docs, dtype=dtype)


def test_writer_output_matches_the_byte_layout(tmp_path: Path) -> None:
    write(tmp_path / "mine", DOCS)
    build(tmp_path / "ref", DOCS)
    assert (tmp_path / "mine.idx").read_bytes() == (tmp_path / "ref.idx").read_bytes()
    assert (tmp_path / "mine.bin").read_bytes() == (tmp_path / "ref.bin").read_bytes()


@pytest.mark.parametrize("form", ["prefix", "idx", "bin"])
def test_round_trip_through_every_path_form(tmp_path: Path, form: str) -> None:
    write(tmp_path / "data", DOCS)
    path = {"prefix": tmp_path / "data", "idx": tmp_path / "data.idx", "bin": tmp_path / "data.bin"}[form]
    assert detect_format(path) == "megatron"
    ds = open_dataset(path, validate="deep")
    assert entries(ds) == DOCS
    assert ds.doc_lengths.tolist() == [3, 2, 0, 5]
    assert ds.overlap_prefix.tolist() == [0, 0, 0, 0]
    # Megatron has no field for them: tokenloom's sidecar data.tokenloom.json gives them back
    assert (ds.dtype, ds.num_tokens, ds.eos_id, ds.vocab_size) == (np.dtype("uint16"), 10, 0, 100)
    assert ds.tokens(1, 6).tolist() == [6, 0, 7, 0, 8]


def test_directory_of_prefixes_is_one_shard_each_sorted(tmp_path: Path) -> None:
    write(tmp_path / "b_text_document", [[3], [4, 5]])
    write(tmp_path / "a_text_document", DOCS)
    assert detect_format(tmp_path) == "megatron"
    ds = open_dataset(tmp_path)
    assert ds.num_shards == 2
    assert ds.metadata["prefixes"] == ["a_text_document", "b_text_document"]
    assert entries(ds) == [*DOCS, [3], [4, 5]]


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int32", "int64"])
def test_every_token_dtype_round_trips(tmp_path: Path, dtype: str) -> None:
    write(tmp_path / "d", DOCS, dtype=dtype)
    ds = open_dataset(tmp_path / "d")
    assert ds.dtype == np.dtype(dtype)
    assert entries(ds) == DOCS


def test_sequences_are_entries_and_documents_are_kept(tmp_path: Path) -> None:
    build(tmp_path / "d", [[1, 2], [3], [4, 5, 6]], document_indices=[0, 2, 3])
    ds = open_dataset(tmp_path / "d")
    assert entries(ds) == [[1, 2], [3], [4, 5, 6]]
    assert ds.metadata["document_indices"][0].tolist() == [0, 2, 3]
    assert ds.metadata["multimodal"] is False


def test_multimodal_modes_are_recognised_by_size(tmp_path: Path) -> None:
    build(tmp_path / "d", [[1, 2], [3]], modes=[0, 1])
    ds = open_dataset(tmp_path / "d")
    assert entries(ds) == [[1, 2], [3]]
    assert ds.metadata["multimodal"] is True


def test_empty_dataset(tmp_path: Path) -> None:
    write(tmp_path / "d", [])
    ds = open_dataset(tmp_path / "d")
    assert (len(ds), ds.num_tokens) == (0, 0)


def test_writer_refusals(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigError, match="no dtype code for uint32"):
        open_writer(tmp_path / "d", format="megatron", dtype="uint32")
    with (
        pytest.raises(errors.ConfigError, match="cannot store overlap prefixes"),
        open_writer(tmp_path / "d", format="megatron", dtype="uint16") as writer,
    ):
        writer.add([1, 2, 3], overlap_prefix=1)
    assert list(tmp_path.iterdir()) == []  # the aborted writer left nothing
    with pytest.raises(errors.ConfigError, match="is a directory"):
        open_writer(tmp_path, format="megatron", dtype="uint16")
    write(tmp_path / "d", DOCS)
    with pytest.raises(errors.ConfigError, match="already exists"):
        write(tmp_path / "d", DOCS)
    with open_writer(tmp_path / "d.idx", format="megatron", dtype="uint16", overwrite=True) as writer:
        writer.add([1])
    assert entries(open_dataset(tmp_path / "d")) == [[1]]


def test_interrupted_writer_leaves_no_index(tmp_path: Path) -> None:
    writer = open_writer(tmp_path / "d", format="megatron", dtype="uint16")
    writer.add([1, 2])
    assert not (tmp_path / "d.idx").exists()
    with pytest.raises(errors.MissingFileError):
        open_dataset(tmp_path / "d", format="megatron")
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_missing_partner_files(tmp_path: Path) -> None:
    write(tmp_path / "d", DOCS)
    (tmp_path / "d.bin").unlink()
    with pytest.raises(errors.MissingFileError, match="has no data file d.bin"):
        open_dataset(tmp_path / "d", format="megatron")
    write(tmp_path / "e", DOCS)
    (tmp_path / "e.idx").unlink()
    with pytest.raises(errors.MissingFileError, match="e.bin has no index"):
        open_dataset(tmp_path / "e", format="megatron")
    (tmp_path / "d.idx").unlink()
    with pytest.raises(errors.MissingFileError, match="e.bin has no .idx"):
        open_dataset(tmp_path, format="megatron")


def test_deep_validation_refuses_negative_ids(tmp_path: Path) -> None:
    build(tmp_path / "d", [[1, -3]], dtype="int32")
    assert entries(open_dataset(tmp_path / "d")) == [[1, -3]]
    with pytest.raises(errors.TokenRangeError, match="-3 outside ids >= 0") as info:
        open_dataset(tmp_path / "d", validate="deep")
    assert info.value.offset == 4
    assert (info.value.path, info.value.record) == (str(tmp_path / "d.bin"), 0)


def test_deep_validation_checks_ids_and_eos_against_what_the_caller_knows(tmp_path: Path) -> None:
    write(tmp_path / "d", DOCS)
    (tmp_path / "d.tokenloom.json").unlink()  # as another tool writes it: nothing recorded
    open_dataset(tmp_path / "d", validate="deep", vocab_size=12, eos_id=0)
    with pytest.raises(errors.TokenRangeError, match=r"token id 11 outside \[0, 11\)") as info:
        open_dataset(tmp_path / "d", validate="deep", vocab_size=11)
    assert (info.value.path, info.value.offset, info.value.record) == (str(tmp_path / "d.bin"), 16, 3)
    with pytest.raises(errors.FormatError, match="expected the EOS id 6"):
        open_dataset(tmp_path / "d", validate="deep", eos_id=6)


def test_dtype_argument_must_match(tmp_path: Path) -> None:
    write(tmp_path / "d", DOCS)
    assert open_dataset(tmp_path / "d", dtype="uint16").dtype == np.dtype("uint16")
    with pytest.raises(errors.ConfigError, match="index records uint16"):
        open_dataset(tmp_path / "d", dtype="int32")


def _u64(value: int) -> bytes:
    return struct.pack("<Q", value)


def _i64(value: int) -> bytes:
    return struct.pack("<q", value)


# DOCS index: 34-byte header, sizes at 34 (4 x int32), pointers at 50 (4 x int64),
# document indices at 82 (5 x int64), 122 bytes in all; the .bin has 20 bytes.
@pytest.mark.parametrize(
    ("patch", "error", "message"),
    [
        (lambda b: b[:20], errors.TruncatedError, "shorter than its 34-byte header"),
        (lambda b: b"MMIDIDY\x00\x00" + b[9:], errors.FormatError, "magic"),
        (lambda b: b[:9] + _u64(2) + b[17:], errors.FormatError, "version 2"),
        (lambda b: b[:17] + b"\x09" + b[18:], errors.FormatError, "dtype code 9"),
        (lambda b: b[:17] + b"\x07" + b[18:], errors.FormatError, "float32"),
        (lambda b: b[:17] + b"\x03" + b[18:], errors.FormatError, "int16"),
        (lambda b: b[:18] + _u64(5) + b[26:], errors.TruncatedError, "5 sequences"),
        (lambda b: b[:18] + _u64(2**60) + b[26:], errors.TruncatedError, "sequences"),
        (lambda b: b[:26] + _u64(4) + b[34:], errors.IndexCorruptError, "4 document indices"),
        (lambda b: b[:-8], errors.TruncatedError, "imply an index of 122 bytes"),
        (lambda b: b + b"\0" * 3, errors.IndexCorruptError, "the file has 125"),
        (lambda b: b[:26] + _u64(0) + b[34:82], errors.IndexCorruptError, "document count is 0"),
        (lambda b: b[:34] + struct.pack("<i", -1) + b[38:], errors.IndexCorruptError, "size -1 is negative"),
        (lambda b: b[:58] + _i64(4) + b[66:], errors.IndexCorruptError, "pointer 4, expected 6"),
        (lambda b: b[:58] + _i64(4000) + b[66:], errors.IndexCorruptError, "past the end of the 20-byte data file"),
        (lambda b: b[:82] + _i64(1) + b[90:], errors.IndexCorruptError, "first document index is 1"),
        (lambda b: b[:90] + _i64(3) + b[98:], errors.IndexCorruptError, "decrease"),
        (lambda b: b[:114] + _i64(3), errors.IndexCorruptError, "last document index is 3"),
    ],
)
def test_index_corruption_named_errors(tmp_path: Path, patch, error, message) -> None:
    write(tmp_path / "d", DOCS)
    idx = tmp_path / "d.idx"
    assert len(idx.read_bytes()) == 122
    idx.write_bytes(patch(idx.read_bytes()))
    with pytest.raises(error, match=message) as info:
        open_dataset(tmp_path / "d", format="megatron")
    assert info.value.path == str(idx)


def test_data_file_size_must_match_the_sizes(tmp_path: Path) -> None:
    write(tmp_path / "d", DOCS)
    data = tmp_path / "d.bin"
    raw = data.read_bytes()
    data.write_bytes(raw[:-2])
    with pytest.raises(errors.TruncatedError, match="announces 20 data bytes") as info:
        open_dataset(tmp_path / "d")
    assert info.value.path == str(data)
    data.write_bytes(raw + b"\0\0")
    with pytest.raises(errors.IndexCorruptError, match="the data file has 22"):
        open_dataset(tmp_path / "d")


# -- properties ------------------------------------------------------------------------


@fuzz(50)
@given(docs=st.lists(st.lists(st.integers(0, 65535), max_size=20), max_size=15))
def test_any_documents_round_trip(tmp_path_factory, docs) -> None:
    prefix = tmp_path_factory.mktemp("ds") / "data"
    with open_writer(prefix, format="megatron", dtype="uint16", vocab_size=65536) as writer:
        for doc in docs:
            writer.add(doc)
    ds = open_dataset(prefix, validate="deep")
    assert entries(ds) == docs


def _drawn_file(tmp_path_factory, data) -> tuple[Path, Path]:
    """A fresh folder with the dataset d and one of its two files drawn by hypothesis."""
    root = tmp_path_factory.mktemp("ds")
    write(root / "d", DOCS)
    return root, root / data.draw(st.sampled_from(["d.idx", "d.bin"]))


@fuzz(60)
@given(data=st.data())
def test_any_truncation_raises(tmp_path_factory, data) -> None:
    root, target = _drawn_file(tmp_path_factory, data)
    refused_after(truncate_drawn, data, target, lambda: open_dataset(root / "d", format="megatron"))


@fuzz(100)
@given(data=st.data())
def test_any_byte_flip_raises_or_reads_in_bounds(tmp_path_factory, data) -> None:
    root, target = _drawn_file(tmp_path_factory, data)
    flip_drawn_bit(data, target)
    try:
        ds = open_dataset(root / "d", format="megatron")
    except errors.DataError:
        return
    lengths = ds.doc_lengths
    assert int(lengths.sum()) == ds.num_tokens == (root / "d.bin").stat().st_size // ds.dtype.itemsize
    for i in range(len(ds)):
        assert len(ds[i]) == lengths[i]
    assert len(ds.tokens(0, ds.num_tokens)) == ds.num_tokens
