"""Modalities .pbin: both layouts, layout detection by consistency, crash safety, corruption."""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
from formats_helpers import byte_changes, entries, fuzz, opened_after_each, refuses_link_and_fifo, write_docs
from hypothesis import given
from hypothesis import strategies as st

from tokenloom.formats import (
    ConfigError,
    DataError,
    FormatError,
    IndexCorruptError,
    ResourceLimitError,
    TokenRangeError,
    TruncatedError,
    UnsafeFormatError,
    detect_format,
    open_dataset,
    open_writer,
)

DOCS = [[5, 6, 0], [7, 0], [], [8, 9, 10, 11, 0]]


def write(path: Path, docs, *, dtype="uint16", **options) -> Path:
    return write_docs(path, "packed", docs, dtype=dtype, **options)


def hand_built(
    tokens: list[int], index: list[tuple[int, int]], *, token_size: int | None = 4, protocol: int = 4
) -> bytes:
    """A .pbin as Modalities builds it: data length, [token size], tokens, pickle.dumps(index)."""
    size = token_size or 4
    data = b"".join(t.to_bytes(size, "little") for t in tokens)
    header = len(data).to_bytes(8, "little") + (b"" if token_size is None else token_size.to_bytes(4, "little"))
    return header + data + pickle.dumps(index, protocol=protocol)


@pytest.mark.parametrize(
    ("dtype", "legacy"), [("uint8", False), ("uint16", False), ("uint32", False), ("uint16", True)]
)
def test_round_trip_both_layouts(tmp_path: Path, dtype: str, legacy: bool) -> None:
    path = write(tmp_path / "data.pbin", DOCS, dtype=dtype, legacy=legacy)
    assert detect_format(path) == "packed"
    ds = open_dataset(path)
    assert entries(ds) == DOCS
    assert ds.doc_lengths.tolist() == [3, 2, 0, 5]
    assert ds.overlap_prefix.tolist() == [0, 0, 0, 0]
    assert ds.num_tokens == 10
    assert ds.dtype == np.dtype("uint32" if legacy else dtype)
    assert ds.metadata["layouts"] == {"data.pbin": "legacy" if legacy else "current"}
    assert ds.tokens(2, 6).tolist() == [0, 7, 0, 8]
    assert not list(tmp_path.glob("*.tmp"))


def test_current_layout_bytes_match_modalities_writer(tmp_path: Path) -> None:
    # Modalities 0.5.0 create_packed_data.PackedDataGenerator._writer_thread: 8-byte LE data length,
    # 4-byte LE token size, tokens, then pickle.dumps([(byte offset in the data section, byte length)]).
    path = write(tmp_path / "a.pbin", [[1, 2], [3]], dtype="uint16")
    raw = path.read_bytes()
    assert raw[:12] == struct.pack("<QI", 6, 2)
    assert raw[12:18] == np.array([1, 2, 3], "<u2").tobytes()
    assert pickle.loads(raw[18:]) == [(0, 4), (4, 2)]  # our own output, in memory


def test_legacy_layout_bytes(tmp_path: Path) -> None:
    path = write(tmp_path / "a.pbin", [[1, 2], [3]], dtype="uint16", legacy=True)
    raw = path.read_bytes()
    assert raw[:8] == struct.pack("<Q", 12)
    assert raw[8:20] == np.array([1, 2, 3], "<u4").tobytes()
    assert pickle.loads(raw[20:]) == [(0, 8), (8, 4)]


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_reads_hand_built_files_of_every_protocol(tmp_path: Path, protocol: int) -> None:
    current = tmp_path / "c.pbin"
    current.write_bytes(hand_built(list(range(20)), [(0, 24), (24, 40), (64, 12), (76, 4)], protocol=protocol))
    assert open_dataset(current).doc_lengths.tolist() == [6, 10, 3, 1]
    legacy = tmp_path / "l.pbin"
    legacy.write_bytes(hand_built([3, 4, 5], [(0, 8), (8, 4)], token_size=None, protocol=protocol))
    ds = open_dataset(legacy)
    assert (entries(ds), ds.metadata["layouts"]["l.pbin"]) == ([[3, 4], [5]], "legacy")


def test_reads_indexes_that_count_from_the_file_start(tmp_path: Path) -> None:
    # Modalities before mid-2024 (and the original big-header writer) stored byte starts from the file start.
    current = tmp_path / "c.pbin"
    current.write_bytes(hand_built([1, 2, 3], [(12, 8), (20, 4)]))
    assert entries(open_dataset(current)) == [[1, 2], [3]]
    legacy = tmp_path / "l.pbin"
    legacy.write_bytes(hand_built([1, 2, 3], [(8, 8), (16, 4)], token_size=None))
    assert entries(open_dataset(legacy)) == [[1, 2], [3]]


def test_empty_files_of_both_layouts(tmp_path: Path) -> None:
    for legacy in (False, True):
        path = write(tmp_path / f"e{legacy}.pbin", [], legacy=legacy)
        ds = open_dataset(path)
        assert (len(ds), ds.num_tokens) == (0, 0)


def test_directory_of_pbin_files_is_one_dataset(tmp_path: Path) -> None:
    write(tmp_path / "d" / "b.pbin", [[3], [4, 0]])
    write(tmp_path / "d" / "a.pbin", [[1, 2]])
    ds = open_dataset(tmp_path / "d")
    assert ds.num_shards == 2
    assert entries(ds) == [[1, 2], [3], [4, 0]]


def test_dtype_request_and_deep_validation(tmp_path: Path) -> None:
    path = write(tmp_path / "a.pbin", [[1, 2, 0], [99, 0]])
    (tmp_path / "a.pbin.tokenloom.json").unlink()  # as Modalities writes it: no vocab size or EOS id
    with pytest.raises(ConfigError, match="2-byte tokens"):
        open_dataset(path, dtype="uint32")
    with pytest.raises(TokenRangeError):
        open_dataset(path, validate="deep", vocab_size=50)
    with pytest.raises(FormatError, match="EOS"):
        open_dataset(path, validate="deep", eos_id=2)
    assert len(open_dataset(path, validate="deep", vocab_size=100, eos_id=0)) == 2


def test_writer_refusals(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be stored"):
        open_writer(tmp_path / "a.pbin", format="packed", dtype="int64")
    with pytest.raises(ConfigError, match="end in"):
        open_writer(tmp_path / "a.bin", format="packed", dtype="uint16")
    write(tmp_path / "a.pbin", [[1]])
    with pytest.raises(ConfigError, match="exists"):
        open_writer(tmp_path / "a.pbin", format="packed", dtype="uint16")
    writer = open_writer(tmp_path / "b.pbin", format="packed", dtype="uint16")
    with pytest.raises(ConfigError, match="overlap"):
        writer.add_batch([1, 2, 3], [1, 2], overlap_prefix=[0, 1])
    with pytest.raises(ConfigError, match="not keyed"):
        writer.add_keyed({"sequence": [1]})
    writer.abort()
    with pytest.raises(TokenRangeError):
        write(tmp_path / "c.pbin", [[100]])


def test_a_failed_write_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), open_writer(tmp_path / "a.pbin", format="packed", dtype="uint16") as writer:
        writer.add([1, 2])
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


def test_an_unfinished_write_is_not_a_pbin(tmp_path: Path) -> None:
    writer = open_writer(tmp_path / "a.pbin", format="packed", dtype="uint16")
    writer.add([1, 2])
    assert not (tmp_path / "a.pbin").exists()  # only a.pbin.<pid>-<hex>.tmp: its header says 0 bytes, no index
    (tmp,) = tmp_path.glob("a.pbin.*.tmp")
    (tmp_path / "copy.pbin").write_bytes(tmp.read_bytes())
    with pytest.raises(DataError):
        open_dataset(tmp_path / "copy.pbin")
    writer.abort()
    assert not tmp.exists()


# -- bad input ---------------------------------------------------------------------------------


def test_header_longer_than_the_file(tmp_path: Path) -> None:
    path = tmp_path / "a.pbin"
    path.write_bytes(struct.pack("<QI", 1000, 4) + b"\0" * 8)
    with pytest.raises(TruncatedError, match="announces 1000 data bytes") as info:
        open_dataset(path)
    assert (info.value.field, info.value.offset) == ("data_length", 0)
    path.write_bytes(b"\1\2\3")
    with pytest.raises(TruncatedError, match="8-byte"):
        open_dataset(path)


@pytest.mark.parametrize(
    ("index", "message"),
    [
        ([(0, 8), (8, 8)], "outside|ends at"),  # past the data section
        ([(0, 8), (4, 8)], "overlap"),
        ([(0, 4), (8, 4)], "in no entry"),  # a gap
        ([(0, 6), (6, 6)], "aligned"),
        ([(4, 8)], "first entry starts"),
        ([(0, 12, 1)], "pair"),
        ([], "index is empty"),
    ],
)
def test_index_entries_out_of_range_or_overlapping(tmp_path: Path, index, message: str) -> None:
    path = tmp_path / "a.pbin"
    path.write_bytes(hand_built([1, 2, 3], index))
    with pytest.raises(IndexCorruptError, match=message) as info:
        open_dataset(path)
    assert info.value.path == str(path)
    assert info.value.field == "index"


def test_malicious_pickle_is_refused_and_never_run(tmp_path: Path) -> None:
    class Boom:
        def __reduce__(self):
            return (os.system, ("touch pwned",))

    path = tmp_path / "a.pbin"
    path.write_bytes(struct.pack("<QI", 4, 4) + b"\1\0\0\0" + pickle.dumps([Boom()], protocol=4))
    with pytest.raises(UnsafeFormatError, match="not allowed") as info:
        open_dataset(path)
    assert info.value.offset is not None and info.value.offset >= 16
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_unknown_token_size_and_ambiguity_are_format_errors(tmp_path: Path) -> None:
    path = tmp_path / "a.pbin"
    path.write_bytes(hand_built([1, 2], [(0, 24), (24, 8)], token_size=3))
    with pytest.raises(FormatError, match="neither"):
        open_dataset(path)
    with pytest.raises(FormatError, match="token size 3"):
        open_dataset(path, layout="current")
    with pytest.raises(ConfigError):
        open_dataset(path, layout="newest")


def test_index_size_cap(tmp_path: Path) -> None:
    path = write(tmp_path / "a.pbin", [[1]] * 50)
    with pytest.raises(ResourceLimitError, match="cap"):
        open_dataset(path, max_index_bytes=64, layout="current")
    with pytest.raises(ResourceLimitError, match="entries"):
        open_dataset(path, max_entries=10, layout="current")


def test_symlink_out_of_the_directory_and_fifo(tmp_path: Path) -> None:
    outside = write(tmp_path / "outside.pbin", [[1]])
    (tmp_path / "d").mkdir()
    link = tmp_path / "d" / "a.pbin"
    fifo = lambda: open_dataset(link, format="packed")  # noqa: E731
    refuses_link_and_fifo(link, outside, lambda: open_dataset(tmp_path / "d"), fifo, outside_match="outside")


# -- properties --------------------------------------------------------------------------------

VOCAB = 1000
DOC_LISTS = st.lists(st.lists(st.integers(0, VOCAB - 1), max_size=12), max_size=8)


@fuzz(60)
@given(docs=DOC_LISTS, legacy=st.booleans())
def test_any_documents_round_trip(tmp_path: Path, docs: list[list[int]], legacy: bool) -> None:
    path = tmp_path / "p.pbin"
    with open_writer(path, format="packed", dtype="uint16", vocab_size=VOCAB, legacy=legacy, overwrite=True) as w:
        for doc in docs:
            w.add(doc)
    ds = open_dataset(path, validate="deep", vocab_size=VOCAB)
    assert entries(ds) == docs


def read_everything_in_bounds(ds) -> None:
    total = 0
    for i in range(len(ds)):
        total += len(ds[i])
    assert total == ds.num_tokens == int(ds.doc_lengths.sum())
    assert len(ds.tokens(0, ds.num_tokens)) == ds.num_tokens
    for shard in ds.shards:
        end = shard.tokens_offset + shard.num_tokens * shard.dtype.itemsize
        assert end <= shard.tokens_path.stat().st_size


@pytest.mark.parametrize("legacy", [False, True])
def test_every_truncation_raises(tmp_path: Path, legacy: bool) -> None:
    raw = write(tmp_path / "full.pbin", DOCS, legacy=legacy).read_bytes()
    cut = tmp_path / "cut.pbin"
    for length in range(len(raw)):
        cut.write_bytes(raw[:length])
        with pytest.raises(DataError):
            open_dataset(cut)


@pytest.mark.parametrize("legacy", [False, True])
def test_every_byte_flip_raises_or_stays_in_bounds(tmp_path: Path, legacy: bool) -> None:
    raw = write(tmp_path / "full.pbin", DOCS, legacy=legacy).read_bytes()
    flipped = tmp_path / "flip.pbin"
    opened = 0
    for ds in opened_after_each(flipped, byte_changes(raw, range(len(raw)), (0x01, 0x80, 0xFF))):
        opened += 1
        read_everything_in_bounds(ds)
    assert opened > 0  # flips inside token data are undetectable without checksums, and must still read safely
