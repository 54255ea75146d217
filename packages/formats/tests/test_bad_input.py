"""Bad input across formats: the cases of issue 3 that per-format tests did not pin down.

Each case asserts the named DataError subclass and that the error says where
(``path``, and ``offset``/``field``/``record`` where the format has them).
"""

from __future__ import annotations

import dataclasses
import os
import struct
from pathlib import Path
from typing import Any

import pytest
from formats_helpers import byte_changes, opened_after_each, refuses_link_and_fifo

from tokenloom.formats import errors, open_dataset, open_store, open_writer, read_manifest
from tokenloom.formats.io import MANIFEST_NAME, write_manifest

h5py = pytest.importorskip("h5py") if os.environ.get("TOKENLOOM_ISOLATED_ENV") != "formats" else __import__("h5py")

DOCS = [[5, 6, 0], [7, 0], [], [8, 9, 10, 11, 0]]
WRITERS = {
    "native": ("ds", {}),
    "flat": ("ds", {}),
    "megatron": ("ds/train", {}),
    "packed": ("ds.pbin", {}),
    "h5": ("ds.h5", {}),
    "bin-meta": ("ds", {}),
}


def write(root: Path, fmt: str, docs=DOCS, *, vocab_size: int = 100) -> Path:
    rel, options = WRITERS[fmt]
    with open_writer(root / rel, format=fmt, dtype="uint16", vocab_size=vocab_size, eos_id=0, **options) as w:
        for doc in docs:
            w.add(doc)
    return root / rel


# -- token id >= vocab size: always at write time, and under deep validation -------------------------


@pytest.mark.parametrize("fmt", WRITERS)
def test_every_writer_refuses_an_id_outside_the_vocabulary_and_leaves_nothing(tmp_path: Path, fmt: str) -> None:
    with pytest.raises(errors.TokenRangeError, match=r"token id 100 at position 1 outside \[0, 100\)") as info:
        write(tmp_path, fmt, [[1, 2], [3, 100]])
    assert info.value.record == 1
    assert info.value.path == str(tmp_path / WRITERS[fmt][0])
    with pytest.raises(errors.DataError):
        open_dataset(tmp_path / WRITERS[fmt][0])


@pytest.mark.parametrize("fmt", WRITERS)
def test_deep_validation_names_the_first_id_outside_the_vocabulary(tmp_path: Path, fmt: str) -> None:
    path = write(tmp_path, fmt)
    if fmt in ("native", "flat"):  # the vocab size lives in the manifest: record a smaller one
        write_manifest(path, dataclasses.replace(read_manifest(path), vocab_size=11))
        options: dict[str, Any] = {}
    else:  # peer formats (without tokenloom's sidecar, as other tools write them) and stores record none
        for sidecar in path.parent.glob(path.name + ".tokenloom.json"):
            sidecar.unlink()
        options = {"vocab_size": 11}
    open_dataset(path, **options)  # fast validation reads no tokens
    with pytest.raises(errors.TokenRangeError, match=r"token id 11 outside \[0, 11\)") as info:
        open_dataset(path, validate="deep", **options)
    assert info.value.record is not None and info.value.offset is not None
    assert Path(info.value.path or "").exists()


# -- empty and missing files ---------------------------------------------------------------------------

EMPTIED = [
    ("native", "shard_00000.idx", errors.ChecksumError),  # fast: the manifest's size check comes first
    ("native", "shard_00000.bin", errors.ChecksumError),
    ("native", MANIFEST_NAME, errors.FormatError),
    ("flat", "shard_00000.npy", errors.ChecksumError),
    ("megatron", "train.idx", errors.TruncatedError),
    ("megatron", "train.bin", errors.TruncatedError),
    ("packed", "ds.pbin", errors.TruncatedError),
    ("h5", "ds.h5", errors.FormatError),
    ("bin-meta", "meta.json", errors.FormatError),
    ("bin-meta", "sequence.bin", errors.TruncatedError),
]


@pytest.mark.parametrize(("fmt", "name", "error"), EMPTIED)
def test_an_emptied_file_is_a_named_error(tmp_path: Path, fmt: str, name: str, error: type) -> None:
    path = write(tmp_path, fmt)
    victim = next(p for p in tmp_path.rglob(name) if p.is_file())
    victim.write_bytes(b"")
    # an empty .idx no longer says it is Megatron's: detection cannot tell, so name the format
    with pytest.raises(error) as info:
        open_dataset(path, format=fmt if name == "train.idx" else None)
    assert info.value.path is not None and Path(info.value.path).name in (name, victim.parent.name)


def _native_without_manifest(root: Path) -> Path:
    path = write(root, "native")
    (path / MANIFEST_NAME).unlink()
    return path


def test_native_idx_without_bin_and_bin_without_idx(tmp_path: Path) -> None:
    path = write(tmp_path / "a", "native")
    (path / "shard_00000.idx").unlink()
    with pytest.raises(errors.MissingFileError, match="shard_00000.idx is listed in the manifest but absent"):
        open_dataset(path)
    path = _native_without_manifest(tmp_path / "b")
    (path / "shard_00000.idx").unlink()
    with pytest.raises(errors.MissingFileError, match="shard_00000.bin has no .idx") as info:
        open_dataset(path, format="native", validate="deep")
    assert info.value.path == str(path / "shard_00000.bin")
    path = _native_without_manifest(tmp_path / "c")
    (path / "shard_00000.bin").unlink()
    with pytest.raises(errors.MissingFileError, match="has no data file shard_00000.bin") as info:
        open_dataset(path, format="native", validate="deep")
    assert info.value.path == str(path / "shard_00000.idx")
    # the missing partner is named first, whatever is wrong with the file that is there
    (path / "shard_00000.idx").unlink()
    (path / "shard_00000.idx").symlink_to(tmp_path / "nowhere.idx")  # dangling
    with pytest.raises(errors.MissingFileError, match="has no data file shard_00000.bin"):
        open_dataset(path, format="native", validate="deep")


def test_native_data_size_and_final_sentinel(tmp_path: Path) -> None:
    path = _native_without_manifest(tmp_path)
    data = path / "shard_00000.bin"
    raw = data.read_bytes()
    data.write_bytes(raw + b"\0")
    with pytest.raises(errors.TruncatedError, match="not a multiple of the uint16 item size") as info:
        open_dataset(path, format="native", validate="deep")
    assert info.value.path == str(data)
    data.write_bytes(raw + b"\0\0")  # one token more than the final offset announces
    with pytest.raises(
        errors.IndexCorruptError, match="final offset 10 differs from the data file's 11 tokens"
    ) as info:
        open_dataset(path, format="native", validate="deep")
    assert (info.value.path, info.value.field) == (str(path / "shard_00000.idx"), "offsets")


def test_native_count_is_checked_against_the_file_size_before_the_index_is_read(tmp_path: Path) -> None:
    path = _native_without_manifest(tmp_path)
    idx = path / "shard_00000.idx"
    idx.write_bytes(idx.read_bytes()[:12] + struct.pack("<I", 2**32 - 1) + idx.read_bytes()[16:])
    with pytest.raises(errors.TruncatedError, match=f"entry count {2**32 - 1}") as info:
        open_dataset(path, format="native")
    assert (info.value.offset, info.value.field) == (12, "count")


def test_manifest_unknown_version_and_respelled_bytes(tmp_path: Path) -> None:
    path = write(tmp_path, "native")
    manifest = path / MANIFEST_NAME
    raw = manifest.read_bytes()
    manifest.write_bytes(raw.replace(b'"manifest_version": 2', b'"manifest_version": 7'))
    with pytest.raises(errors.FormatError, match="manifest version 7, expected one of \\(1, 2\\)") as info:
        open_dataset(path)
    assert info.value.field == "manifest_version"
    manifest.write_bytes(raw.replace(b"\n", b"\r\n", 1))  # same JSON content, other bytes
    with pytest.raises(errors.ChecksumError, match="differ from the form tokenloom writes"):
        open_dataset(path)
    manifest.write_bytes(raw + b" ")
    with pytest.raises(errors.ChecksumError):
        open_dataset(path)


def test_packed_data_length_not_a_multiple_of_the_token_size(tmp_path: Path) -> None:
    path = tmp_path / "a.pbin"
    import pickle

    path.write_bytes(struct.pack("<QI", 3, 2) + b"\1\0\2" + pickle.dumps([(0, 3)], protocol=4))
    with pytest.raises(errors.FormatError, match="data length 3 is not a multiple of the token size 2") as info:
        open_dataset(path, layout="current")
    assert (info.value.path, info.value.offset, info.value.field) == (str(path), 0, "data_length")
    with pytest.raises(errors.FormatError, match="neither .pbin layout fits"):
        open_dataset(path)


# -- symlinks and special files for the formats not covered per format ----------------------------------


def test_megatron_symlink_out_of_the_root_and_fifo(tmp_path: Path) -> None:
    path = write(tmp_path, "megatron")
    data = path.with_name("train.bin")
    outside = tmp_path / "outside.bin"
    data.rename(outside)
    info = refuses_link_and_fifo(data, outside, lambda: open_dataset(path.parent / "train.idx"))
    assert info.value.path == str(data)


def test_h5_symlink_out_of_the_root_and_fifo(tmp_path: Path) -> None:
    path = write(tmp_path, "h5")
    store = tmp_path / "store"
    store.mkdir()
    refuses_link_and_fifo(store / "a.h5", path, lambda: open_store(store), lambda: open_dataset(store))


# -- native: every truncation and every single-byte change, exhaustively ---------------------------------


def _native_files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def test_native_every_truncation_and_every_header_index_manifest_byte_change_raises(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    with open_writer(root, format="native", dtype="uint16", vocab_size=100, eos_id=0, shard_size_tokens=4) as w:
        for i, doc in enumerate(DOCS):
            w.add(doc, overlap_prefix=1 if i == 3 else 0)
    original = _native_files(root)
    checked = 0
    for name, raw in original.items():
        path = root / name
        for cut in range(len(raw)):  # any truncation of any file: fast validation refuses it
            path.write_bytes(raw[:cut])
            with pytest.raises(errors.DataError):
                open_dataset(root)
            checked += 1
        if name.endswith(".bin"):
            path.write_bytes(raw)
            continue
        # any change of one byte of an index or the manifest
        for changed in byte_changes(raw, range(len(raw)), (0x01, 0x02, 0x10, 0x80, 0xFF)):
            path.write_bytes(changed)
            with pytest.raises(errors.DataError):
                open_dataset(root)
            checked += 1
        path.write_bytes(raw)
    assert checked > 5000
    assert [open_dataset(root)[i].tolist() for i in range(len(DOCS))] == DOCS


def test_native_any_data_byte_change_raises_under_deep_validation(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    with open_writer(root, format="native", dtype="uint16", vocab_size=100, eos_id=0, shard_size_tokens=4) as w:
        for doc in DOCS:
            w.add(doc)
    for data in sorted(root.glob("*.bin")):
        raw = data.read_bytes()
        for changed in byte_changes(raw, range(len(raw)), (0x01, 0x80)):
            data.write_bytes(changed)
            open_dataset(root)  # fast mode reads no token data
            with pytest.raises(errors.ChecksumError, match=data.name):
                open_dataset(root, validate="deep")
        data.write_bytes(raw)


def test_megatron_every_truncation_and_byte_change_raises_or_reads_in_bounds(tmp_path: Path) -> None:
    path = write(tmp_path, "megatron")
    for name in ("train.idx", "train.bin"):
        target = path.with_name(name)
        raw = target.read_bytes()
        for cut in range(len(raw)):
            target.write_bytes(raw[:cut])
            with pytest.raises(errors.DataError):
                open_dataset(path)
        for ds in opened_after_each(target, byte_changes(raw, range(len(raw)), (0x01, 0x80, 0xFF)), path):
            assert int(ds.doc_lengths.sum()) == ds.num_tokens
            assert ds.num_tokens * ds.dtype.itemsize == path.with_name("train.bin").stat().st_size
            assert sum(len(ds[i]) for i in range(len(ds))) == ds.num_tokens
        _store_reads_in_bounds(target)
        target.write_bytes(raw)


def _store_reads_in_bounds(target: Path) -> None:
    """The store view of ``target`` opens and reads its whole sequence column, or refuses with a DataError."""
    try:
        store = open_store(target)
        assert len(store.fetch(0, len(store), "sequence")) == len(store)
    except errors.DataError:
        pass


def test_h5_byte_changes_raise_or_read_in_bounds(tmp_path: Path) -> None:
    path = write(tmp_path, "h5")
    raw = path.read_bytes()
    target = tmp_path / "changed.h5"
    for ds in opened_after_each(target, byte_changes(raw, range(0, len(raw), 7), (0xFF,))):
        for shard in ds.shards:
            end = shard.tokens_offset + shard.num_tokens * shard.dtype.itemsize
            assert end <= target.stat().st_size
        assert sum(len(ds[i]) for i in range(len(ds))) == ds.num_tokens
        _store_reads_in_bounds(target)


def test_a_nul_byte_in_a_manifest_file_name_is_a_named_error_api_and_cli(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from tokenloom.formats.cli.commands import validate

    path = tmp_path / "ds"
    with open_writer(path, format="native", dtype="uint16", vocab_size=100, eos_id=0) as writer:
        writer.add([1, 2, 0])
    manifest = read_manifest(path)
    files = [dataclasses.replace(f, name=f.name.replace(".bin", "\0.bin")) for f in manifest.files]
    write_manifest(path, dataclasses.replace(manifest, files=tuple(files)))  # a valid checksum over the bad name
    with pytest.raises(errors.FormatError, match="contains a NUL byte") as info:
        open_dataset(path)
    assert info.value.path == str(path / MANIFEST_NAME) and info.value.field == "files.name"
    assert info.value.record == 1
    result = CliRunner().invoke(validate, [str(path)])
    assert result.exit_code == 1 and "FormatError" in result.output and "NUL byte" in result.output
    assert "manifest.json" in result.output


def test_safe_stat_refuses_a_nul_byte_with_a_named_error(tmp_path: Path) -> None:
    from tokenloom.formats.io import safe_file

    with pytest.raises(errors.UnsafePathError, match="NUL byte"):
        safe_file(tmp_path, tmp_path / "a\0.bin")


@pytest.mark.parametrize(
    ("change", "message", "field"),
    [
        ({"bytes": True}, "manifest field 'bytes' is bool, expected int", "bytes"),
        ({"bytes": 54.0}, "manifest field 'bytes' is float, expected int", "bytes"),
        ({"bytes": "54"}, "manifest field 'bytes' is str, expected int", "bytes"),
        ({"name": 5}, "manifest field 'name' is int, expected str", "name"),
        ({"xxh3_128": None}, "manifest field 'xxh3_128' is NoneType, expected str", "xxh3_128"),
        ({"role": False}, "manifest field 'role' is bool, expected str", "role"),
        ({"name": ...}, "manifest has no 'name'", "name"),
        ({"bytes": ...}, "manifest has no 'bytes'", "bytes"),
        ({"xxh3_128": ...}, "manifest has no 'xxh3_128'", "xxh3_128"),
        ({"role": ...}, "manifest has no 'role'", "role"),
        ([1, 2], "manifest file entry is not an object", "files"),
        (None, "manifest file entry is not an object", "files"),
    ],
)
def test_a_malformed_manifest_file_entry_is_named(tmp_path: Path, change: Any, message: str, field: str) -> None:
    # a well-formed entry takes a fast path of exact type checks; any other is named as before it existed
    import orjson

    from tokenloom.formats.io.manifest import _serialise, content_checksum

    path = write(tmp_path, "native")
    payload = orjson.loads((path / MANIFEST_NAME).read_bytes())
    entry = payload["files"][1]
    if isinstance(change, dict):
        entry.update({k: v for k, v in change.items() if v is not ...})
        for key in [k for k, v in change.items() if v is ...]:
            del entry[key]
    else:
        payload["files"][1] = change
    del payload["checksum"]
    payload["checksum"] = content_checksum(payload)  # a valid checksum over the bad entry
    (path / MANIFEST_NAME).write_bytes(_serialise(payload))
    with pytest.raises(errors.FormatError) as info:
        read_manifest(path)
    assert str(info.value).startswith(message + " [file ")
    assert info.value.field == field and info.value.path == str(path / MANIFEST_NAME)


def test_extra_keys_in_a_manifest_file_entry_are_ignored(tmp_path: Path) -> None:
    import orjson

    from tokenloom.formats.io.manifest import _serialise, content_checksum

    path = write(tmp_path, "native")
    before = read_manifest(path).files
    payload = orjson.loads((path / MANIFEST_NAME).read_bytes())
    for entry in payload["files"]:
        entry["written_by"] = "a later tokenloom"
    del payload["checksum"]
    payload["checksum"] = content_checksum(payload)
    (path / MANIFEST_NAME).write_bytes(_serialise(payload))
    assert read_manifest(path).files == before
