"""GPT-Simple's .idx byte layout, both ways, with fixtures built from its documented layout.

The layout (gpt_simple/pretokenize.py, write_idx/read_idx): b"GPTS", uint32 version 1,
uint32 dtype code (2 uint16, 4 uint32), uint32 document count, int64 offsets (n + 1),
uint16 overlap lengths (n). The gpt-simple-lm code itself is exercised in
integration-tests/tests/test_gpt_simple_interop.py.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from tokenloom.formats import (
    ChecksumError,
    ConfigError,
    FormatError,
    IndexCorruptError,
    TokenRangeError,
    TruncatedError,
    detect_format,
    open_buckets,
    open_dataset,
    open_writer,
    read_manifest,
)
from tokenloom.formats.cli.commands import convert, validate
from tokenloom.formats.io import MANIFEST_NAME
from tokenloom.formats.native import NativeWriter, adopt_native

DOCS = [[5, 6, 0], [7, 0], [], [8, 9, 10, 11, 0]]


def gpt_simple_idx(offsets, overlaps, code: int) -> bytes:
    """An .idx exactly as GPT-Simple's write_idx builds it (field by field)."""
    raw = b"GPTS" + struct.pack("<I", 1) + struct.pack("<I", code) + struct.pack("<I", len(overlaps))
    return raw + np.asarray(offsets, np.int64).tobytes() + np.asarray(overlaps, np.uint16).tobytes()


def write_gpt_simple_shard(directory: Path, stem: str, docs, overlaps=None, dtype: Any = np.uint16) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    overlaps = [0] * len(docs) if overlaps is None else overlaps
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    tokens = np.concatenate([np.asarray(d, dtype) for d in docs]) if docs else np.empty(0, dtype)
    (directory / f"{stem}.bin").write_bytes(tokens.astype(dtype).tobytes())
    code = 2 if np.dtype(dtype) == np.uint16 else 4
    (directory / f"{stem}.idx").write_bytes(gpt_simple_idx(offsets, overlaps, code))


def entries(ds) -> list[list[int]]:
    return [ds[i].tolist() for i in range(len(ds))]


# -- tokenloom -> bytes ------------------------------------------------------------------------------


@pytest.mark.parametrize(("dtype", "code"), [("uint16", 2), ("uint32", 4)])
def test_writer_emits_gpt_simple_bytes_exactly(tmp_path: Path, dtype: str, code: int) -> None:
    with open_writer(tmp_path / "ds", format="native", dtype=dtype, vocab_size=100, eos_id=0) as writer:
        for doc, overlap in zip(DOCS, [0, 1, 0, 2], strict=True):
            writer.add(doc, overlap_prefix=overlap)
    idx = (tmp_path / "ds" / "shard_00000.idx").read_bytes()
    assert idx[:16] == b"GPTS" + bytes([1, 0, 0, 0]) + bytes([code, 0, 0, 0]) + bytes([4, 0, 0, 0])
    assert struct.unpack_from("<4sIII", idx) == (b"GPTS", 1, code, 4)
    assert idx == gpt_simple_idx([0, 3, 5, 5, 10], [0, 1, 0, 2], code)
    tokens = (tmp_path / "ds" / "shard_00000.bin").read_bytes()
    assert tokens == np.array([5, 6, 0, 7, 0, 8, 9, 10, 11, 0], dtype=np.dtype(dtype).newbyteorder("<")).tobytes()
    assert read_manifest(tmp_path / "ds").version == 2


@pytest.mark.parametrize(("dtype", "code"), [("uint8", 0x101), ("int32", 0x104), ("int64", 0x108)])
def test_other_dtypes_get_tokenloom_extension_codes_with_a_warning(
    tmp_path: Path, dtype: str, code: int, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.WARNING, logger="tokenloom.formats"),
        open_writer(tmp_path / "ds", format="native", dtype=dtype) as writer,
    ):
        writer.add([1, 2, 3])
    assert "GPT-Simple reads only uint16 and uint32" in caplog.text
    assert struct.unpack_from("<4sIII", (tmp_path / "ds" / "shard_00000.idx").read_bytes()) == (b"GPTS", 1, code, 1)
    assert entries(open_dataset(tmp_path / "ds")) == [[1, 2, 3]]


def test_a_shard_is_closed_at_the_uint32_entry_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(NativeWriter, "max_entries_per_shard", 3)  # 2**32 - 1 in real use
    docs = [[i, 0] for i in range(1, 9)]
    with open_writer(tmp_path / "ds", format="native", dtype="uint16") as writer:
        writer.add_batch(np.concatenate(docs[:5]), [2] * 5)
        for doc in docs[5:]:
            writer.add(doc)
    counts = [struct.unpack_from("<4sIII", p.read_bytes())[3] for p in sorted((tmp_path / "ds").glob("*.idx"))]
    assert counts == [3, 3, 2]
    assert entries(open_dataset(tmp_path / "ds")) == docs


# -- bytes -> tokenloom ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_a_gpt_simple_directory_opens_fast_without_manifest(tmp_path: Path, dtype) -> None:
    root = tmp_path / "web"
    write_gpt_simple_shard(root, "00001", [[70000 % 65000, 3, 1], [4, 1]], overlaps=[0, 1], dtype=dtype)
    write_gpt_simple_shard(root, "00000", [[9, 9, 1]], dtype=dtype)
    write_gpt_simple_shard(root, "00002", [], dtype=dtype)  # GPT-Simple writes empty shards too
    assert detect_format(root) == "native"
    ds = open_dataset(root)
    assert ds.dtype == np.dtype(dtype)
    assert [s.name for s in ds.shards] == ["00000", "00001", "00002"]  # sorted .bin names, as GPT-Simple
    assert entries(ds) == [[9, 9, 1], [5000, 3, 1], [4, 1]]
    assert ds.overlap_prefix.tolist() == [0, 0, 1]
    assert ds.fingerprint and ds.eos_id is None and ds.vocab_size is None
    assert not (root / MANIFEST_NAME).exists()  # opening never writes


def test_fast_open_reads_no_tokens(tmp_path: Path) -> None:
    # int32 shards with negative ids: only a token scan (deep) can see them
    with open_writer(tmp_path / "ds", format="native", dtype="int32") as writer:
        writer.add([1, 2, 3])
    (tmp_path / "ds" / MANIFEST_NAME).unlink()
    (tmp_path / "ds" / "shard_00000.bin").write_bytes(np.array([1, -2, 3], "<i4").tobytes())
    assert len(open_dataset(tmp_path / "ds")) == 1
    with pytest.raises(TokenRangeError, match="token id -2"):
        open_dataset(tmp_path / "ds", validate="deep")


def test_overlap_equal_to_the_entry_length_is_accepted(tmp_path: Path) -> None:
    # GPT-Simple writes overlap == window length when overlap_size >= max_length
    write_gpt_simple_shard(tmp_path / "d", "00000", [[1, 2], [2, 3], [3, 0]], overlaps=[0, 2, 1])
    assert open_dataset(tmp_path / "d").overlap_prefix.tolist() == [0, 2, 1]
    write_gpt_simple_shard(tmp_path / "e", "00000", [[1, 2], [2, 0]], overlaps=[0, 3])
    with pytest.raises(IndexCorruptError, match="overlap prefix 3 is longer than its entry of 2") as info:
        open_dataset(tmp_path / "e")
    assert info.value.record == 1


# -- bad input -------------------------------------------------------------------------------------


def _idx(tmp_path: Path) -> Path:
    write_gpt_simple_shard(tmp_path / "d", "00000", DOCS)
    return tmp_path / "d" / "00000.idx"


def test_version_other_than_1(tmp_path: Path) -> None:
    idx = _idx(tmp_path)
    idx.write_bytes(idx.read_bytes()[:4] + struct.pack("<I", 2) + idx.read_bytes()[8:])
    with pytest.raises(FormatError, match="version 2, expected 1") as info:
        open_dataset(tmp_path / "d")
    assert (info.value.path, info.value.offset, info.value.field) == (str(idx), 4, "version")


@pytest.mark.parametrize("code", [0, 1, 3, 5, 8, 0x102])
def test_unknown_dtype_code(tmp_path: Path, code: int) -> None:
    idx = _idx(tmp_path)
    idx.write_bytes(idx.read_bytes()[:8] + struct.pack("<I", code) + idx.read_bytes()[12:])
    with pytest.raises(FormatError, match=f"dtype code {code}, expected 2 \\(uint16\\) or 4") as info:
        open_dataset(tmp_path / "d")
    assert (info.value.offset, info.value.field) == (8, "dtype")


@pytest.mark.parametrize(("count", "error"), [(5, TruncatedError), (3, IndexCorruptError), (0, IndexCorruptError)])
def test_count_that_disagrees_with_the_file_size(tmp_path: Path, count: int, error: type) -> None:
    idx = _idx(tmp_path)
    idx.write_bytes(idx.read_bytes()[:12] + struct.pack("<I", count) + idx.read_bytes()[16:])
    with pytest.raises(error, match=f"entry count {count} implies an index of") as info:
        open_dataset(tmp_path / "d")
    assert (info.value.offset, info.value.field) == (12, "count")


def test_bin_size_that_disagrees_with_the_offsets(tmp_path: Path) -> None:
    idx = _idx(tmp_path)
    data = idx.with_suffix(".bin")
    data.write_bytes(data.read_bytes()[:-2])
    with pytest.raises(TruncatedError, match="final offset 10 differs from the data file's 9 tokens"):
        open_dataset(tmp_path / "d")


def test_a_bucket_mixing_dtypes(tmp_path: Path) -> None:
    write_gpt_simple_shard(tmp_path / "train" / "web", "00000", DOCS, dtype=np.uint16)
    write_gpt_simple_shard(tmp_path / "train" / "web", "00001", DOCS, dtype=np.uint32)
    with pytest.raises(FormatError, match="shard dtype uint32 differs from the dataset's uint16") as info:
        open_buckets(tmp_path)
    assert info.value.path == str(tmp_path / "train" / "web" / "00001.idx")


def _make_legacy(root: Path) -> None:
    """A dataset in tokenloom's pre-release layout: <4sHHQ headers (code 2 = uint16), manifest version 1."""
    from tokenloom.formats.io import describe_files, write_manifest

    with open_writer(root, format="native", dtype="uint16", vocab_size=100, eos_id=0) as writer:
        for doc, overlap in zip(DOCS, [0, 1, 0, 2], strict=True):
            writer.add(doc, overlap_prefix=overlap)
    idx = root / "shard_00000.idx"
    idx.write_bytes(struct.pack("<4sHHQ", b"GPTS", 1, 2, 4) + idx.read_bytes()[16:])
    manifest = read_manifest(root)
    files = describe_files(root, [(f.name, f.role) for f in manifest.files])
    write_manifest(root, dataclasses.replace(manifest, version=1, files=files, checksum=""))


def test_the_old_tokenloom_layout_names_the_conversion_command(tmp_path: Path) -> None:
    _make_legacy(tmp_path / "old")
    with pytest.raises(FormatError, match="pre-release native layout") as info:
        open_dataset(tmp_path / "old")
    assert "tokenloom convert OLD_DIR NEW_DIR --to native --from native-v0" in str(info.value)
    (tmp_path / "old" / MANIFEST_NAME).rename(tmp_path / "manifest.v1")  # the header alone says so too
    with pytest.raises(FormatError, match="pre-release native layout") as info:
        open_dataset(tmp_path / "old")
    assert (info.value.offset, info.value.field) == (4, "version")
    assert "--from native-v0" in str(info.value)
    (tmp_path / "manifest.v1").rename(tmp_path / "old" / MANIFEST_NAME)
    args = [str(tmp_path / "old"), str(tmp_path / "new"), "--to", "native", "--from", "native-v0", "--no-progress"]
    result = CliRunner().invoke(convert, args)
    assert result.exit_code == 0, result.output
    new = open_dataset(tmp_path / "new", validate="deep")
    assert entries(new) == DOCS
    assert new.overlap_prefix.tolist() == [0, 1, 0, 2]
    assert (new.vocab_size, new.eos_id) == (100, 0)
    assert struct.unpack_from("<4sIII", (tmp_path / "new" / "shard_00000.idx").read_bytes()) == (b"GPTS", 1, 2, 4)


# -- adoption and buckets --------------------------------------------------------------------------------


def test_adopting_writes_a_manifest_that_later_opens_verify(tmp_path: Path) -> None:
    root = tmp_path / "web"
    write_gpt_simple_shard(root, "00000", DOCS, overlaps=[0, 1, 0, 2])
    write_gpt_simple_shard(root, "00001", [[3, 0]])
    before = open_dataset(root)
    manifest = adopt_native(root, vocab_size=100)
    assert (manifest.num_tokens, manifest.num_documents, manifest.vocab_size) == (12, 5, 100)
    assert [f.name for f in manifest.files] == ["00000.idx", "00000.bin", "00001.idx", "00001.bin"]
    after = open_dataset(root, validate="deep")
    assert entries(after) == entries(before)
    assert after.overlap_prefix.tolist() == before.overlap_prefix.tolist()
    assert after.vocab_size == 100
    raw = bytearray((root / "00000.bin").read_bytes())
    raw[0] ^= 1
    (root / "00000.bin").write_bytes(bytes(raw))
    with pytest.raises(ChecksumError, match="00000.bin"):
        open_dataset(root, validate="deep")
    with pytest.raises(ConfigError, match="already has a manifest.json"):
        adopt_native(root)


def test_adopted_windows_without_eod_pass_deep_validation_with_an_eos_id(tmp_path: Path) -> None:
    # GPT-Simple's windows: only those reaching a document's end carry EOD (0); the first here has none
    root = tmp_path / "web"
    write_gpt_simple_shard(root, "00000", [[5, 6, 7, 8], [7, 8, 9, 0], [3, 0]], overlaps=[0, 2, 0])
    manifest = adopt_native(root, vocab_size=100, eos_id=0)
    assert manifest.metadata["eos_placement"] == "document_end"
    assert open_dataset(root, validate="deep").eos_id == 0
    # the same entries under tokenloom's rule (no placement recorded) are refused by deep validation
    with open_writer(tmp_path / "ours", format="native", dtype="uint16", vocab_size=100, eos_id=0) as writer:
        for doc in ([5, 6, 7, 8], [7, 8, 9, 0]):
            writer.add(doc)
    with pytest.raises(FormatError, match="entry ends with token 8, expected the EOS id 0"):
        open_dataset(tmp_path / "ours", validate="deep")


def test_adopting_checks_the_vocab_size(tmp_path: Path) -> None:
    write_gpt_simple_shard(tmp_path / "web", "00000", DOCS)
    with pytest.raises(TokenRangeError, match="token id 11"):
        adopt_native(tmp_path / "web", vocab_size=11)
    assert not (tmp_path / "web" / MANIFEST_NAME).exists()


def test_validate_write_manifest_command(tmp_path: Path) -> None:
    write_gpt_simple_shard(tmp_path / "web", "00000", DOCS)
    result = CliRunner().invoke(validate, [str(tmp_path / "web"), "--write-manifest"])
    assert result.exit_code == 0, result.output
    assert "problems   none" in result.output
    assert f"wrote {tmp_path / 'web' / 'manifest.json'}: checksums of 2 files" in result.output
    assert "records checksums" not in result.output  # no advice to run the command that is running
    assert read_manifest(tmp_path / "web").num_documents == 4
    before = (tmp_path / "web" / "manifest.json").read_bytes()
    # again (wave 4: --write-manifest also adds block hashes to an older manifest): nothing to add, nothing rewritten
    result = CliRunner().invoke(validate, [str(tmp_path / "web"), "--write-manifest"])
    assert result.exit_code == 0 and "block hashes already recorded" in result.output, result.output
    assert (tmp_path / "web" / "manifest.json").read_bytes() == before


def test_gpt_simple_train_bucket_layout_opens_as_buckets(tmp_path: Path) -> None:
    data = tmp_path / "tokenized"
    write_gpt_simple_shard(data / "train" / "web", "00000", DOCS)
    write_gpt_simple_shard(data / "train" / "code", "00000", [[1, 0]], dtype=np.uint32)
    write_gpt_simple_shard(data / "val" / "web", "00000", [[2, 0]])
    write_gpt_simple_shard(data / "val" / "code", "00000", [[3, 0]])
    train = open_buckets(data)
    assert list(train) == ["code", "web"]  # sorted: GPT-Simple's bucket ids
    assert entries(train["web"]) == DOCS and train["code"].dtype == np.uint32
    assert entries(open_buckets(data, split="val")["code"]) == [[3, 0]]
    assert entries(open_buckets(data / "train")["code"]) == [[1, 0]]  # the split directory itself
    assert entries(open_dataset(data / "train" / "web")) == DOCS
    (data / "train" / "empty").mkdir()
    with pytest.raises(FormatError, match="bucket 'empty' is empty"):
        open_buckets(data)


def test_validate_write_manifest_records_vocab_and_eos(tmp_path: Path) -> None:
    write_gpt_simple_shard(tmp_path / "web", "00000", DOCS)
    result = CliRunner().invoke(
        validate, [str(tmp_path / "web"), "--write-manifest", "--vocab-size", "11", "--eos-id", "0"]
    )
    assert result.exit_code == 1, result.output  # DOCS hold id 11: refused before any manifest is written
    assert not (tmp_path / "web" / MANIFEST_NAME).exists()
    result = CliRunner().invoke(
        validate, [str(tmp_path / "web"), "--write-manifest", "--vocab-size", "100", "--eos-id", "0"]
    )
    assert result.exit_code == 0, result.output
    manifest = read_manifest(tmp_path / "web")
    assert (manifest.vocab_size, manifest.eos_id) == (100, 0)
