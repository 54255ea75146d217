"""An on-disk format is its folder: a toy format registered from this test module converts to and from
every other one, and convert, locks, uploads and output names ask its spec, never its name."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tokenloom.formats import (
    ConfigError,
    FormatSpec,
    Shard,
    TokenDataset,
    TokenWriter,
    Validate,
    _registry,
    available_formats,
    convert_dataset,
    detect_format,
    open_dataset,
    open_writer,
    register_format,
    writable_formats,
)
from tokenloom.formats.io import source as io_source
from tokenloom.formats.io.atomic import fsync_dir
from tokenloom.formats.io.urls import RemoteURL
from tokenloom.formats.remote.convert_output import _layout

# -- the toy format: PREFIX.toks (uint16 tokens) and PREFIX.lens (int64 entry lengths, written last) ----------


def _prefix(path: Path) -> Path:
    return path.with_suffix("") if path.suffix in (".toks", ".lens") else path


def toy_targets(target: Path) -> list[Path]:
    prefix = _prefix(target)
    return [prefix, prefix.with_suffix(".toks"), prefix.with_suffix(".lens")]


def is_toy(path: Path) -> bool:
    return _prefix(path).with_suffix(".lens").is_file()


def open_toy(path: Path, *, validate: Validate = Validate.FAST, dtype=None) -> TokenDataset:
    prefix = _prefix(path)
    lengths = np.fromfile(prefix.with_suffix(".lens"), dtype="<i8")
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    shard = Shard(
        tokens_path=prefix.with_suffix(".toks"),
        dtype=np.dtype("<u2"),
        num_tokens=int(offsets[-1]),
        offsets=offsets,
        overlap_prefix=np.zeros(len(lengths), dtype=np.uint16),
        name=prefix.name,
    )
    return TokenDataset([shard], format="toy", root=prefix.parent)


class ToyWriter(TokenWriter):
    format = "toy"

    def __init__(self, path: str | os.PathLike[str], **basics) -> None:
        super().__init__(path, **basics)
        self.prefix = _prefix(self.path)
        self._tokens: list[np.ndarray] = []
        self._lengths: list[np.ndarray] = []

    def _write_batch(self, tokens: np.ndarray, lengths: np.ndarray, overlaps: np.ndarray) -> None:
        self._refuse_overlaps(overlaps, "toy files")
        self._tokens.append(tokens.astype("<u2"))
        self._lengths.append(np.asarray(lengths, dtype="<i8"))

    def _commit(self) -> None:
        for suffix, parts in ((".toks", self._tokens), (".lens", self._lengths)):  # lengths last
            tmp = self.prefix.with_suffix(suffix + ".tmp")
            (np.concatenate(parts) if parts else np.empty(0, "<i8")).tofile(tmp)
            os.replace(tmp, self.prefix.with_suffix(suffix))
        fsync_dir(self.prefix.parent)

    def _abort(self) -> None:
        for suffix in (".toks.tmp", ".lens.tmp"):
            self.prefix.with_suffix(suffix).unlink(missing_ok=True)


TOY = FormatSpec(
    "toy",
    "toy token files: PREFIX.toks + PREFIX.lens",
    detect=is_toy,
    open=open_toy,
    writer=ToyWriter,
    suffixes=(".toks",),
    targets=toy_targets,
    output_name="data",
)


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> FormatSpec:
    """The toy format registered for one test (the registry and the data suffixes restored after)."""
    monkeypatch.setattr(_registry, "_FORMATS", dict(_registry._FORMATS))
    monkeypatch.setattr(io_source, "_data_suffixes", io_source._data_suffixes)
    register_format(TOY)
    return TOY


def _native(tmp_path: Path) -> Path:
    path = tmp_path / "native"
    with open_writer(path, format="native", dtype="uint16", vocab_size=1000) as writer:
        for n in (3, 1, 5, 2):
            writer.add(np.arange(n, dtype=np.uint16) + n)
    return path


def test_a_toy_format_registered_from_a_test_converts_to_and_from_native(tmp_path: Path, toy: FormatSpec) -> None:
    source = _native(tmp_path)
    assert "toy" in writable_formats() and available_formats()["toy"] is toy
    result = convert_dataset(source, tmp_path / "out" / "data", to="toy")
    assert (result.source_format, result.target_format, result.entries) == ("native", "toy", 4)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["data.lens", "data.toks"]
    assert detect_format(tmp_path / "out" / "data") == "toy"
    back = tmp_path / "back"
    convert_dataset(tmp_path / "out" / "data", back, to="native")
    original, copy = open_dataset(source), open_dataset(back)
    assert len(copy) == len(original) == 4
    assert all(np.array_equal(copy[i], original[i]) for i in range(4))


def test_the_spec_names_where_a_dataset_goes_and_which_files_are_its(toy: FormatSpec, tmp_path: Path) -> None:
    assert toy.output_path(tmp_path) == tmp_path / "data" and not toy.owns_directory
    assert toy.owns_file("data.toks") and toy.owns_file("data.lens") and not toy.owns_file("notes.txt")
    assert ".toks" in io_source.data_suffixes()  # a remote view holds its data files as placeholders
    native = available_formats()["native"]
    assert native.output_path(tmp_path) == tmp_path and native.owns_directory
    assert native.owns_file("shard_00001.idx") and not native.owns_file("data.toks")


def test_an_upload_puts_the_last_target_last(toy: FormatSpec) -> None:
    prefix, local_name, last = _layout(RemoteURL("s3", "bucket", "runs/a/data.toks"), toy)
    assert (prefix, local_name, last) == (RemoteURL("s3", "bucket", "runs/a"), "data", "data.lens")
    native = available_formats()["native"]
    assert _layout(RemoteURL("s3", "bucket", "runs/ds"), native)[2] == "manifest.json"


def test_convert_refuses_a_target_among_the_sources_files_by_the_spec(tmp_path: Path, toy: FormatSpec) -> None:
    convert_dataset(_native(tmp_path), tmp_path / "data", to="toy")
    with pytest.raises(ConfigError, match="the source"):  # data.toks is the source's token file
        convert_dataset(tmp_path / "data", tmp_path / "data.toks", to="toy")
    convert_dataset(tmp_path / "data", tmp_path / "other", to="toy")  # a prefix beside it: not the source
    assert is_toy(tmp_path / "other")


def test_an_unwritable_format_lists_the_writable_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot write format 'native-v0', writable: \[.*'native'"):
        open_writer(tmp_path / "x", format="native-v0", dtype="uint16")
