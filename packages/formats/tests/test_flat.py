"""Flat shard directories: round trip, foreign (KempnerForge/tatm) layouts, dtypes, corruption."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import orjson
import pytest
from formats_helpers import (
    entries,
    flip_drawn_bit,
    fuzz,
    refused_after,
    refuses_link_and_fifo,
    truncate_drawn,
    write_docs,
)
from hypothesis import given
from hypothesis import strategies as st

from tokenloom.formats import detect_format, errors, open_dataset, open_writer
from tokenloom.formats.flat import DOCUMENT_LENGTHS_NAME
from tokenloom.formats.io import MANIFEST_NAME, WRITING_MARKER

EOS = 0
DOCS = [[5, 6, 0], [7, 0], [8, 9, 10, 11, 0]]


def write(path: Path, docs, **options) -> None:
    write_docs(path, "flat", docs, **{"eos_id": EOS, **options})


def test_round_trip_with_eos_boundaries(tmp_path: Path) -> None:
    write(tmp_path / "ds", DOCS)
    assert detect_format(tmp_path / "ds") == "flat"
    ds = open_dataset(tmp_path / "ds", validate="deep")
    assert ds.format == "flat"
    assert entries(ds) == DOCS
    assert ds.doc_lengths.tolist() == [3, 2, 5]
    assert ds.overlap_prefix.tolist() == [0, 0, 0]
    assert (ds.eos_id, ds.vocab_size, ds.dtype) == (EOS, 100, np.dtype("uint16"))
    assert ds.metadata["split"] == "lengths"
    manifest = orjson.loads((tmp_path / "ds" / MANIFEST_NAME).read_bytes())
    assert manifest["metadata"]["flat"] == {
        "file_pattern": "shard_*.npy",
        "document_boundaries": "lengths",
        "shard_entries": [3],
    }
    assert (tmp_path / "ds" / DOCUMENT_LENGTHS_NAME).read_bytes() == np.array([3, 2, 5], "<i8").tobytes()
    assert entries(open_dataset(tmp_path / "ds", split="eos")) == DOCS  # the EOS split agrees
    assert entries(open_dataset(tmp_path / "ds", split="shard")) == [[t for d in DOCS for t in d]]


def test_shards_are_plain_npy_files_split_at_document_ends(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    docs = [[*rng.integers(1, 100, size=int(n)).tolist(), EOS] for n in rng.integers(0, 30, size=100)]
    write(tmp_path / "ds", docs, shard_size_tokens=200)
    names = sorted(p.name for p in (tmp_path / "ds").glob("*.npy"))
    assert len(names) > 3
    stream = np.concatenate([np.load(tmp_path / "ds" / name) for name in names])  # a peer's view
    assert stream.tolist() == [t for doc in docs for t in doc]
    for name in names:
        assert np.load(tmp_path / "ds" / name)[-1] == EOS  # no document is split across shards
    assert entries(open_dataset(tmp_path / "ds")) == docs


def test_raw_bin_shards_take_their_dtype_from_the_manifest(tmp_path: Path) -> None:
    write(tmp_path / "ds", DOCS, file_format="bin", shard_size_tokens=4)
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == [
        DOCUMENT_LENGTHS_NAME,
        MANIFEST_NAME,
        "shard_00000.bin",
        "shard_00001.bin",
    ]
    ds = open_dataset(tmp_path / "ds")
    assert ds.metadata["dtype_source"] == MANIFEST_NAME
    assert entries(ds) == DOCS
    with pytest.raises(errors.ConfigError, match="dtype= says uint32, manifest.json says uint16"):
        open_dataset(tmp_path / "ds", dtype="uint32")


def test_documents_without_eos_and_empty_documents_round_trip(tmp_path: Path) -> None:
    docs = [[], [1, 2], [], [3, 4, 5], [6], [], []]
    write(tmp_path / "ds", docs, shard_size_tokens=3)
    manifest = orjson.loads((tmp_path / "ds" / MANIFEST_NAME).read_bytes())
    assert manifest["metadata"]["flat"]["document_boundaries"] == "lengths"
    assert sum(manifest["metadata"]["flat"]["shard_entries"]) == len(docs)
    ds = open_dataset(tmp_path / "ds")
    assert entries(ds) == docs
    assert ds.tokens(0, ds.num_tokens).tolist() == [1, 2, 3, 4, 5, 6]
    assert [np.load(p).tolist() for p in sorted((tmp_path / "ds").glob("*.npy"))] == [[1, 2, 3, 4, 5], [6]]
    # another file pattern than the recorded one cannot use the recorded lengths
    assert entries(open_dataset(tmp_path / "ds", file_pattern="shard_00001.npy")) == [[6]]


def test_interior_eos_keeps_recorded_boundaries(tmp_path: Path) -> None:
    write(tmp_path / "ds", [[1, EOS, 2, EOS]])
    assert entries(open_dataset(tmp_path / "ds")) == [[1, EOS, 2, EOS]]
    assert entries(open_dataset(tmp_path / "ds", split="eos")) == [[1, EOS], [2, EOS]]


@pytest.mark.parametrize(
    ("damage", "error", "message"),
    [
        (lambda raw: raw[:-8], errors.IndexCorruptError, "8 per document"),
        (
            lambda raw: raw[:8] + (-1).to_bytes(8, "little", signed=True) + raw[16:],
            errors.IndexCorruptError,
            "negative",
        ),
        (lambda raw: raw[:8] + (3).to_bytes(8, "little") + raw[16:], errors.IndexCorruptError, "add up to"),
    ],
)
def test_damaged_document_lengths_are_named(tmp_path: Path, damage, error, message) -> None:
    write(tmp_path / "ds", [[1, 2], [3], [4, 5, 6]], shard_size_tokens=2)
    path = tmp_path / "ds" / DOCUMENT_LENGTHS_NAME
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(errors.ChecksumError, match=DOCUMENT_LENGTHS_NAME):  # fast mode checksums it (an index file)
        open_dataset(tmp_path / "ds")
    with pytest.raises(error, match=message) as info:
        open_dataset(tmp_path / "ds", validate="none")
    assert info.value.path == str(path)
    assert info.value.field == "document_lengths"
    path.unlink()
    with pytest.raises(errors.MissingFileError, match=DOCUMENT_LENGTHS_NAME):
        open_dataset(tmp_path / "ds", validate="none")


def test_foreign_npy_directory_each_shard_one_entry_sorted_by_name(tmp_path: Path) -> None:
    root = tmp_path / "kf"
    root.mkdir()
    np.save(root / "train_b.npy", np.array([3, 4, 0], dtype=np.uint32))
    np.save(root / "train_a.npy", np.array([1, 2, 0, 9], dtype=np.uint32))
    np.save(root / "val.npy", np.array([7], dtype=np.uint32))
    assert detect_format(root) == "flat"
    ds = open_dataset(root)
    assert entries(ds) == [[1, 2, 0, 9], [3, 4, 0], [7]]
    assert ds.eos_id is None and ds.fingerprint is None
    only_train = open_dataset(root, file_pattern="train_*.npy", split="eos", eos_id=0)
    assert entries(only_train) == [[1, 2, 0], [9], [3, 4, 0]]
    single = open_dataset(root / "val.npy")
    assert entries(single) == [[7]]


def test_split_eos_without_an_eos_id_is_a_config_error(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.array([1, 2], dtype=np.uint16))
    with pytest.raises(errors.ConfigError, match="needs the EOS id"):
        open_dataset(tmp_path, format="flat", split="eos")
    with pytest.raises(errors.ConfigError, match="split='lines'"):
        open_dataset(tmp_path, format="flat", split="lines")


def test_raw_bin_needs_a_declared_dtype_and_infer_is_logged(tmp_path: Path, caplog) -> None:
    np.arange(6, dtype="<u2").tofile(tmp_path / "tokens_0.bin")
    with pytest.raises(errors.FormatError, match="no declared dtype") as info:
        open_dataset(tmp_path, format="flat")
    assert info.value.path == str(tmp_path / "tokens_0.bin")
    assert open_dataset(tmp_path, format="flat", dtype="uint16")[0].tolist() == [0, 1, 2, 3, 4, 5]
    with caplog.at_level(logging.WARNING, logger="tokenloom.formats"):
        guessed = open_dataset(tmp_path, format="flat", dtype="infer")
    assert guessed.dtype == np.dtype("uint32")  # 12 bytes is a multiple of 4: the guess is uint32
    assert "guessed uint32" in caplog.text
    np.arange(3, dtype="<u2").tofile(tmp_path / "tokens_1.bin")
    assert open_dataset(tmp_path, format="flat", dtype="infer").dtype == np.dtype("uint16")


def test_size_not_a_multiple_of_the_item_size(tmp_path: Path) -> None:
    (tmp_path / "t.bin").write_bytes(b"\x01\x00\x02")
    with pytest.raises(errors.TruncatedError, match="not a multiple of the uint16 item size"):
        open_dataset(tmp_path, format="flat", dtype="uint16")


@pytest.mark.parametrize("kind", ["bin", "npy"])
def test_empty_shard_is_refused(tmp_path: Path, kind: str) -> None:
    if kind == "bin":
        (tmp_path / "t.bin").write_bytes(b"")
    else:
        np.save(tmp_path / "t.npy", np.array([], dtype=np.uint16))
    with pytest.raises(errors.FormatError, match="empty|no tokens"):
        open_dataset(tmp_path, format="flat", dtype="uint16")


def test_npy_dtype_must_match_a_declared_dtype(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.array([1], dtype=np.uint32))
    with pytest.raises(errors.FormatError, match="header says uint32, dtype= says uint16"):
        open_dataset(tmp_path, format="flat", dtype="uint16")


def test_signed_negative_ids_are_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.array([1, 2, -5, 3], dtype=np.int64))
    with pytest.raises(errors.TokenRangeError, match="token id -5 is negative") as info:
        open_dataset(tmp_path)
    assert info.value.offset == 128 + 2 * 8


def test_no_matching_files_and_unsafe_patterns(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.array([1], dtype=np.uint16))
    with pytest.raises(errors.FormatError, match="no shard files match 'b_\\*.npy'"):
        open_dataset(tmp_path, format="flat", file_pattern="b_*.npy")
    with pytest.raises(errors.ConfigError, match="inside the dataset directory"):
        open_dataset(tmp_path, format="flat", file_pattern="../*.npy")


TATM_YAML = """\
content_field: text
corpuses: []
data_content: text
dataset_path: /somewhere/else/entirely
date_downloaded: '2024-08-01'
description: A long description that yaml.dump wraps over more than one line when it
  is longer than the width, which the parser must skip without reading it
download_source: local
name: demo
tokenized_info:
  dtype: uint32
  file_extension: bin
  file_prefix: /somewhere/else/entirely/tokenized  # tatm records an absolute prefix
  tokenizer: t5-base
  vocab_size: 32100
"""


def test_tatm_metadata_yaml_gives_prefix_extension_dtype_and_vocab(tmp_path: Path) -> None:
    (tmp_path / "metadata.yaml").write_text(TATM_YAML)
    np.array([1, 2, 3], dtype="<u4").tofile(tmp_path / "tokenized_0.bin")
    np.array([4, 5], dtype="<u4").tofile(tmp_path / "tokenized_1.bin")
    np.array([9, 9], dtype="<u2").tofile(tmp_path / "other.bin")  # not matched by the prefix
    assert detect_format(tmp_path) == "flat"
    ds = open_dataset(tmp_path)
    assert entries(ds) == [[1, 2, 3], [4, 5]]
    assert (ds.dtype, ds.vocab_size) == (np.dtype("uint32"), 32100)
    assert ds.metadata["file_pattern"] == "tokenized*.bin"
    assert ds.metadata["tokenizer"] == "t5-base"
    with pytest.raises(errors.ConfigError, match="tatm|metadata.yaml says uint32"):
        open_dataset(tmp_path, dtype="uint16")


def test_tatm_metadata_json(tmp_path: Path) -> None:
    (tmp_path / "metadata.json").write_bytes(
        orjson.dumps({"name": "x", "tokenized_info": {"file_prefix": "tok", "dtype": "uint16", "tokenizer": "t"}})
    )
    np.array([1, 2], dtype="<u2").tofile(tmp_path / "tok_000.bin")
    assert entries(open_dataset(tmp_path)) == [[1, 2]]


@pytest.mark.parametrize(
    "block",
    [
        "tokenized_info: {dtype: uint16, file_prefix: t}\n",
        "tokenized_info:\n  dtype: !!python/name:os.system uint16\n  file_prefix: t\n",
        "tokenized_info:\n  file_prefix: t\n  nested:\n    dtype: uint16\n",
        "tokenized_info:\n  file_prefix: 't\n",
    ],
)
def test_yaml_outside_the_subset_is_a_format_error(tmp_path: Path, block: str) -> None:
    (tmp_path / "metadata.yaml").write_text("name: x\n" + block)
    np.array([1, 2], dtype="<u2").tofile(tmp_path / "t_0.bin")
    with pytest.raises(errors.FormatError, match="subset|unterminated") as info:
        open_dataset(tmp_path, format="flat", dtype="uint16")
    assert "dtype=" in str(info.value)


def test_tatm_without_tokenized_info_falls_back_to_explicit_dtype(tmp_path: Path) -> None:
    (tmp_path / "metadata.yaml").write_text("name: raw text\ntokenized_info: null\n")
    np.array([1, 2], dtype="<u2").tofile(tmp_path / "t_0.bin")
    assert entries(open_dataset(tmp_path, format="flat", dtype="uint16")) == [[1, 2]]


def test_writer_refuses_overlap_prefixes_and_empty_datasets(tmp_path: Path) -> None:
    with (
        pytest.raises(errors.ConfigError, match="cannot store overlap prefixes"),
        open_writer(tmp_path / "a", format="flat", dtype="uint16") as writer,
    ):
        writer.add([1, 2, 3], overlap_prefix=1)
    assert list((tmp_path / "a").iterdir()) == []
    with pytest.raises(errors.ConfigError, match="empty dataset"):
        write(tmp_path / "b", [[], []])
    assert list((tmp_path / "b").iterdir()) == []


def test_interrupted_writer_is_never_accepted(tmp_path: Path) -> None:
    writer = open_writer(tmp_path / "ds", format="flat", dtype="uint16", shard_size_tokens=2)
    for doc in DOCS:
        writer.add(doc)  # some shards are published already; the manifest is not
    assert any(p.suffix == ".npy" for p in (tmp_path / "ds").iterdir())
    with pytest.raises(errors.FormatError, match=WRITING_MARKER):
        open_dataset(tmp_path / "ds", format="flat")
    writer.abort()
    assert list((tmp_path / "ds").iterdir()) == []


def test_manifest_catches_size_changes_and_deep_catches_flips(tmp_path: Path) -> None:
    write(tmp_path / "ds", DOCS)
    shard = tmp_path / "ds" / "shard_00000.npy"
    raw = bytearray(shard.read_bytes())
    raw[-2] ^= 4
    shard.write_bytes(bytes(raw))
    open_dataset(tmp_path / "ds")  # fast mode reads no data
    with pytest.raises(errors.ChecksumError, match="shard_00000.npy"):
        open_dataset(tmp_path / "ds", validate="deep")
    shard.write_bytes(bytes(raw[:-2]))
    with pytest.raises(errors.ChecksumError, match="bytes"):
        open_dataset(tmp_path / "ds")


def test_manifest_of_another_format_is_refused(tmp_path: Path) -> None:
    with open_writer(tmp_path / "ds", format="native", dtype="uint16") as writer:
        writer.add([1, 2])
    with pytest.raises(errors.FormatError, match="describes a 'native' dataset"):
        open_dataset(tmp_path / "ds", format="flat")


def test_symlink_leaving_the_root_and_fifo_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    root.mkdir()
    np.save(tmp_path / "outside.npy", np.array([1], dtype=np.uint16))
    refuses_link_and_fifo(root / "a.npy", tmp_path / "outside.npy", lambda: open_dataset(root, format="flat"))


# -- properties ------------------------------------------------------------------------

documents = st.lists(st.lists(st.integers(0, 65535), max_size=12), min_size=1, max_size=12)


@fuzz(40)
@given(docs=documents, shard_size=st.one_of(st.none(), st.integers(1, 30)), file_format=st.sampled_from(["npy", "bin"]))
def test_any_documents_round_trip_exactly(tmp_path_factory, docs, shard_size, file_format) -> None:
    if not any(docs):
        docs = [*docs, [65535]]  # flat shards cannot hold an empty dataset
    root = tmp_path_factory.mktemp("ds") / "ds"
    write(root, docs, eos_id=None, vocab_size=65536, shard_size_tokens=shard_size, file_format=file_format)
    ds = open_dataset(root, validate="deep")
    assert entries(ds) == docs
    assert ds.tokens(0, ds.num_tokens).tolist() == [t for doc in docs for t in doc]
    stream = open_dataset(root, split="shard")  # what a peer reading the shards sees: the same stream
    assert [t for i in range(len(stream)) for t in stream[i].tolist()] == [t for doc in docs for t in doc]


@fuzz(40)
@given(
    docs=st.lists(st.lists(st.integers(1, 65535), max_size=10), min_size=1, max_size=12),
    shard_size=st.integers(1, 30),
)
def test_eos_terminated_documents_round_trip_exactly(tmp_path_factory, docs, shard_size) -> None:
    docs = [[*doc, EOS] for doc in docs]
    root = tmp_path_factory.mktemp("ds") / "ds"
    with open_writer(root, format="flat", dtype="uint16", eos_id=EOS, shard_size_tokens=shard_size) as writer:
        for doc in docs:
            writer.add(doc)
    assert entries(open_dataset(root, validate="deep")) == docs
    assert entries(open_dataset(root, split="eos")) == docs  # a reader without the lengths agrees


def _foreign(root: Path) -> None:
    root.mkdir()
    np.save(root / "a.npy", np.array([5, 6, 0, 7], dtype=np.uint16))
    np.save(root / "b.npy", np.array([8, 0, 9], dtype=np.uint16))


def _read_everything(ds) -> None:
    lengths = ds.doc_lengths
    assert int(lengths.sum()) == ds.num_tokens
    for i in range(len(ds)):
        assert len(ds[i]) == lengths[i]
    assert len(ds.tokens(0, ds.num_tokens)) == ds.num_tokens


def _drawn_file(tmp_path_factory, data, manifest: bool) -> tuple[Path, Path]:
    """A fresh dataset (written with a manifest, or a foreign one) and one of its files drawn by hypothesis."""
    root = tmp_path_factory.mktemp("ds") / "ds"
    if manifest:
        write(root, DOCS, shard_size_tokens=4)
    else:
        _foreign(root)
    return root, data.draw(st.sampled_from(sorted(p for p in root.iterdir())))


@fuzz(60)
@given(data=st.data(), manifest=st.booleans())
def test_any_truncation_raises(tmp_path_factory, data, manifest) -> None:
    root, target = _drawn_file(tmp_path_factory, data, manifest)
    refused_after(truncate_drawn, data, target, lambda: open_dataset(root, format="flat"))


@fuzz(80)
@given(data=st.data(), manifest=st.booleans())
def test_any_byte_flip_raises_or_reads_in_bounds(tmp_path_factory, data, manifest) -> None:
    root, target = _drawn_file(tmp_path_factory, data, manifest)
    flip_drawn_bit(data, target)
    try:
        ds = open_dataset(root, format="flat")
    except errors.DataError:
        return
    _read_everything(ds)
