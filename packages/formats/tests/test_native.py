"""Native GPTS shards: round trip, sharding, manifest, crash safety, corruption."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from formats_helpers import flip_drawn_bit, fuzz, refused_after, truncate_drawn
from hypothesis import given
from hypothesis import strategies as st

from tokenloom.formats import detect_format, errors, open_dataset, open_writer
from tokenloom.formats.io import MANIFEST_NAME, WRITING_MARKER

DOCS = [[5, 6, 0], [7, 0], [], [8, 9, 10, 11, 0]]


def write(path: Path, docs, *, overlaps=None, **options) -> None:
    with open_writer(path, format="native", dtype="uint16", vocab_size=100, eos_id=0, **options) as writer:
        for i, doc in enumerate(docs):
            writer.add(np.array(doc, dtype=np.int64), overlap_prefix=0 if overlaps is None else overlaps[i])


def test_round_trip_and_reading_contract(tmp_path: Path) -> None:
    write(tmp_path / "ds", DOCS, overlaps=[0, 1, 0, 2])
    ds = open_dataset(tmp_path / "ds")
    assert detect_format(tmp_path / "ds") == "native"
    assert len(ds) == 4
    assert [ds[i].tolist() for i in range(4)] == DOCS
    assert ds[-1].tolist() == DOCS[-1]
    assert ds.doc_lengths.tolist() == [3, 2, 0, 5]
    assert ds.doc_lengths.dtype == np.int64
    assert ds.overlap_prefix.tolist() == [0, 1, 0, 2]
    assert ds.overlap_prefix.dtype == np.uint16
    assert ds.num_tokens == 10
    assert ds.dtype == np.uint16
    assert (ds.eos_id, ds.vocab_size) == (0, 100)
    assert ds.fingerprint and len(ds.fingerprint) == 32
    assert ds.tokens(2, 6).tolist() == [0, 7, 0, 8]
    with pytest.raises(IndexError):
        ds[4]


def test_entries_are_zero_copy_views(tmp_path: Path) -> None:
    write(tmp_path / "ds", DOCS)
    ds = open_dataset(tmp_path / "ds")
    entry = ds[0]
    assert not entry.flags.owndata
    assert not entry.flags.writeable


def test_shards_split_at_entry_boundaries_independent_of_batching(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    docs = [[*rng.integers(1, 100, size=int(n)).tolist(), 0] for n in rng.integers(0, 40, size=200)]
    write(tmp_path / "one_by_one", docs, shard_size_tokens=300)
    with open_writer(tmp_path / "batched", dtype="uint16", vocab_size=100, eos_id=0, shard_size_tokens=300) as writer:
        for start in range(0, 200, 37):
            chunk = docs[start : start + 37]
            writer.add_batch(np.concatenate([np.array(d) for d in chunk]), [len(d) for d in chunk])
    a, b = open_dataset(tmp_path / "one_by_one"), open_dataset(tmp_path / "batched")
    assert a.num_shards > 3
    assert a.num_shards == b.num_shards
    for name in sorted(p.name for p in (tmp_path / "one_by_one").iterdir()):
        assert (tmp_path / "one_by_one" / name).read_bytes() == (tmp_path / "batched" / name).read_bytes()
    assert [a[i].tolist() for i in range(len(a))] == docs
    assert a.tokens(250, 700).tolist() == np.concatenate([np.array(d) for d in docs])[250:700].tolist()


def test_one_add_batch_writes_the_bytes_of_a_loop_of_add_with_overlap_prefixes(tmp_path: Path) -> None:
    """add_batch(tokens_flat, lengths, overlap_prefix) is the batched add (about 150-240x faster per entry)."""
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 30, size=500)
    flat = rng.integers(1, 100, size=int(lengths.sum())).astype(np.uint16)
    overlaps = np.minimum(rng.integers(0, 4, size=500), lengths)
    overlaps[0] = 0
    ends = np.cumsum(lengths)
    options = {"dtype": "uint16", "vocab_size": 100, "eos_id": 0, "shard_size_tokens": 777}
    with open_writer(tmp_path / "loop", **options) as writer:
        for end, n, overlap in zip(ends.tolist(), lengths.tolist(), overlaps.tolist(), strict=True):
            writer.add(flat[end - n : end], overlap_prefix=overlap)
    with open_writer(tmp_path / "batch", **options) as writer:
        writer.add_batch(flat, lengths, overlaps)
    names = sorted(p.name for p in (tmp_path / "loop").iterdir())
    assert len(names) > 6 and names == sorted(p.name for p in (tmp_path / "batch").iterdir())
    for name in names:  # every shard, index and the manifest
        assert (tmp_path / "loop" / name).read_bytes() == (tmp_path / "batch" / name).read_bytes(), name
    assert open_dataset(tmp_path / "batch").overlap_prefix.tolist() == overlaps.tolist()


def test_pickling_copies_no_tokens(tmp_path: Path) -> None:
    write(tmp_path / "ds", [[1] * 5000 + [0]])
    ds = open_dataset(tmp_path / "ds")
    ds[0]  # map the tokens in this process
    blob = pickle.dumps(ds)
    assert len(blob) < 5000
    assert pickle.loads(blob)[0].tolist() == [1] * 5000 + [0]


def test_write_time_checks(tmp_path: Path) -> None:
    with pytest.raises(errors.TokenRangeError, match="token id 100"):
        write(tmp_path / "a", [[1, 100]])
    with pytest.raises(errors.ConfigError, match="overlap_prefix 4 for an entry of 3"):
        write(tmp_path / "b", [[1, 2, 0]], overlaps=[4])
    assert not (tmp_path / "a" / MANIFEST_NAME).exists()
    assert list((tmp_path / "a").iterdir()) == []  # an aborted writer leaves nothing


def test_refuses_non_empty_output_unless_overwrite(tmp_path: Path) -> None:
    write(tmp_path / "ds", DOCS)
    with pytest.raises(errors.ConfigError, match="not empty"):
        write(tmp_path / "ds", DOCS)
    write(tmp_path / "ds", DOCS[:1], overwrite=True)
    assert len(open_dataset(tmp_path / "ds")) == 1


def test_interrupted_writer_is_never_accepted(tmp_path: Path) -> None:
    writer = open_writer(tmp_path / "ds", dtype="uint16", vocab_size=100, eos_id=0, shard_size_tokens=2)
    for doc in DOCS:
        writer.add(doc)  # shards are published as they fill, the manifest is not
    with pytest.raises(errors.FormatError, match=WRITING_MARKER):
        open_dataset(tmp_path / "ds", format="native", validate="deep")
    writer.abort()
    assert not any((tmp_path / "ds").iterdir())  # an aborted writer leaves nothing


def test_without_manifest_opens_with_fast_and_deep_validation(tmp_path: Path) -> None:
    write(tmp_path / "ds", DOCS)
    (tmp_path / "ds" / MANIFEST_NAME).unlink()
    for level in ("fast", "deep"):
        ds = open_dataset(tmp_path / "ds", validate=level)
        assert ds.format == "native"
        assert [ds[i].tolist() for i in range(len(ds))] == DOCS
        assert ds.fingerprint and (ds.eos_id, ds.vocab_size) == (None, None)


def test_without_manifest_the_listing_follows_links_and_skips_other_names(tmp_path: Path) -> None:
    # one scandir: a link inside the root counts as its target, a dangling one as no file; other names are skipped
    root = tmp_path / "ds"
    write(root, DOCS, shard_size_tokens=2)
    (root / MANIFEST_NAME).unlink()
    stems = sorted(p.stem for p in root.glob("*.idx"))
    assert len(stems) >= 3
    (root / "real").mkdir()
    (root / f"{stems[1]}.idx").rename(root / "real" / f"{stems[1]}.idx")
    (root / f"{stems[1]}.idx").symlink_to(root / "real" / f"{stems[1]}.idx")
    (root / "x.bin.tmp").write_bytes(b"\0\0")
    (root / ".x.idx.tmp").write_bytes(b"")
    ds = open_dataset(root)
    assert [s.name for s in ds.shards] == stems
    assert [ds[i].tolist() for i in range(len(ds))] == DOCS
    (root / f"{stems[2]}.idx").unlink()
    (root / f"{stems[2]}.idx").symlink_to(root / "gone.idx")
    with pytest.raises(errors.MissingFileError, match=f"{stems[2]}.bin has no .idx"):
        open_dataset(root)


def test_deep_validation_checks_token_range_and_eos(tmp_path: Path) -> None:
    write(tmp_path / "ds", [[1, 2, 3]])
    with pytest.raises(errors.FormatError, match="expected the EOS id 0"):
        open_dataset(tmp_path / "ds", validate="deep")
    assert len(open_dataset(tmp_path / "ds", validate="fast")) == 1


def test_missing_partner_files(tmp_path: Path) -> None:
    write(tmp_path / "ds", DOCS)
    (tmp_path / "ds" / "shard_00000.bin").unlink()
    with pytest.raises(errors.MissingFileError):
        open_dataset(tmp_path / "ds")


def test_symlink_leaving_the_root_is_refused(tmp_path: Path) -> None:
    write(tmp_path / "ds", DOCS)
    outside = tmp_path / "outside.bin"
    (tmp_path / "ds" / "shard_00000.bin").rename(outside)
    (tmp_path / "ds" / "shard_00000.bin").symlink_to(outside)
    with pytest.raises(errors.UnsafePathError, match="outside the dataset root"):
        open_dataset(tmp_path / "ds")


def test_fifo_is_refused(tmp_path: Path) -> None:
    import os

    write(tmp_path / "ds", DOCS)
    (tmp_path / "ds" / "shard_00000.bin").unlink()
    os.mkfifo(tmp_path / "ds" / "shard_00000.bin")
    with pytest.raises(errors.UnsafePathError, match="FIFO"):
        open_dataset(tmp_path / "ds")


@pytest.mark.parametrize(
    ("patch", "error", "message"),
    [
        (lambda b: b"XXXX" + b[4:], errors.FormatError, "magic"),
        (lambda b: b[:4] + (9).to_bytes(4, "little") + b[8:], errors.FormatError, "version 9"),
        (lambda b: b[:8] + (9).to_bytes(4, "little") + b[12:], errors.FormatError, "dtype code 9"),
        (lambda b: b[:12] + (5).to_bytes(4, "little") + b[16:], errors.TruncatedError, "entry count 5"),
        (lambda b: b[:12] + (1).to_bytes(4, "little") + b[16:], errors.IndexCorruptError, "entry count 1"),
        (lambda b: b[:10], errors.TruncatedError, "shorter than its 16-byte header"),
        (lambda b: b[:16] + (1).to_bytes(8, "little", signed=True) + b[24:], errors.IndexCorruptError, "first offset"),
        (lambda b: b[:24] + (9).to_bytes(8, "little") + b[32:], errors.IndexCorruptError, "decrease"),
        (lambda b: b[:48] + (11).to_bytes(8, "little") + b[56:], errors.TruncatedError, "final offset 11"),
        (lambda b: b[:56] + (4).to_bytes(2, "little") + b[58:], errors.IndexCorruptError, "overlap prefix 4"),
    ],
)
def test_index_corruption_named_errors(tmp_path: Path, patch, error, message) -> None:
    write(tmp_path / "ds", DOCS)
    idx = tmp_path / "ds" / "shard_00000.idx"
    idx.write_bytes(patch(idx.read_bytes()))
    # fast validation catches the changed index through its checksum; without the
    # manifest the structural checks (fast, as deep) name the exact problem
    with pytest.raises(errors.ChecksumError):
        open_dataset(tmp_path / "ds")
    (tmp_path / "ds" / MANIFEST_NAME).unlink()
    for level in ("fast", "deep"):
        with pytest.raises(error, match=message):
            open_dataset(tmp_path / "ds", format="native", validate=level)


def test_data_flip_caught_by_deep_validation(tmp_path: Path) -> None:
    write(tmp_path / "ds", DOCS)
    data = tmp_path / "ds" / "shard_00000.bin"
    raw = bytearray(data.read_bytes())
    raw[3] ^= 1
    data.write_bytes(bytes(raw))
    open_dataset(tmp_path / "ds")  # fast mode does not read data files
    with pytest.raises(errors.ChecksumError, match="shard_00000.bin"):
        open_dataset(tmp_path / "ds", validate="deep")


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_file())


def _drawn_file(tmp_path_factory, data) -> tuple[Path, Path]:
    """A fresh sharded dataset and one of its files drawn by hypothesis."""
    root = tmp_path_factory.mktemp("ds") / "ds"
    write(root, DOCS, shard_size_tokens=4)
    return root, data.draw(st.sampled_from(_files(root)))


@fuzz(60)
@given(data=st.data())
def test_any_truncation_or_index_flip_raises(tmp_path_factory, data) -> None:
    root, target = _drawn_file(tmp_path_factory, data)
    damage = truncate_drawn if target.suffix == ".bin" or data.draw(st.booleans()) else flip_drawn_bit
    refused_after(damage, data, target, lambda: open_dataset(root, validate="fast"))


@fuzz(40)
@given(data=st.data())
def test_any_flip_anywhere_raises_under_deep_validation(tmp_path_factory, data) -> None:
    root, target = _drawn_file(tmp_path_factory, data)
    refused_after(flip_drawn_bit, data, target, lambda: open_dataset(root, validate="deep"))


@fuzz(50)
@given(
    docs=st.lists(st.lists(st.integers(0, 65535), max_size=20), max_size=15),
    shard_size=st.one_of(st.none(), st.integers(1, 50)),
)
def test_any_documents_round_trip(tmp_path_factory, docs, shard_size) -> None:
    root = tmp_path_factory.mktemp("ds") / "ds"
    with open_writer(root, dtype="uint16", vocab_size=65536, shard_size_tokens=shard_size) as writer:
        for doc in docs:
            writer.add(np.array(doc, dtype=np.int64))
    ds = open_dataset(root, validate="deep")
    assert [ds[i].tolist() for i in range(len(ds))] == docs
    assert ds.num_tokens == sum(map(len, docs))
