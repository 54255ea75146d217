"""--overwrite never destroys a source or a user's unrelated files (issue #11, data loss)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tokenloom.formats import ConfigError, convert_dataset, open_dataset
from tokenloom.formats.cli.commands import convert
from tokenloom.formats.io import prepare_output_dir
from tokenloom.formats.native import NativeWriter


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def native(tmp_path: Path) -> Path:
    path = tmp_path / "native"
    with NativeWriter(path, dtype="uint16", vocab_size=1000, eos_id=0) as writer:
        for n in (3, 5, 8):
            writer.add(np.arange(1, n + 1) % 1000)
    return path


@pytest.mark.parametrize("to", ["native", "flat"])
def test_convert_onto_its_own_source_is_refused_and_keeps_it(native: Path, to: str) -> None:
    before = _digest(native)
    result = CliRunner().invoke(convert, [str(native), str(native), "--to", to, "--overwrite", "--no-progress"])
    assert result.exit_code == 1
    assert "is the source" in result.output or "source" in result.output
    assert "Traceback" not in result.output
    assert _digest(native) == before
    assert len(open_dataset(native)) == 3


def test_convert_through_a_symlink_onto_its_source_is_refused(native: Path, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(native, target_is_directory=True)
    before = _digest(native)
    with pytest.raises(ConfigError, match="source"):
        convert_dataset(native, link, to="native", writer_options={"overwrite": True})
    assert _digest(native) == before


def test_convert_into_a_directory_that_contains_the_source_is_refused(native: Path, tmp_path: Path) -> None:
    before = _digest(native)
    with pytest.raises(ConfigError, match="contains"):
        convert_dataset(native, tmp_path, to="native", writer_options={"overwrite": True})
    assert _digest(native) == before


def test_convert_into_the_source_directory_is_refused(native: Path) -> None:
    with pytest.raises(ConfigError, match="inside"):
        convert_dataset(native, native / "sub", to="native")
    assert not (native / "sub").exists()


def test_megatron_prefix_converted_onto_itself_is_refused(native: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "mega" / "data"
    convert_dataset(native, prefix, to="megatron")
    before = _digest(prefix.parent)
    for target in (prefix, Path(f"{prefix}.idx"), Path(f"{prefix}.bin")):
        result = CliRunner().invoke(
            convert, [str(prefix), str(target), "--to", "megatron", "--overwrite", "--no-progress"]
        )
        assert result.exit_code == 1, result.output
        assert _digest(prefix.parent) == before
    assert len(open_dataset(prefix)) == 3


def test_overwrite_refuses_a_directory_of_other_files_naming_them(tmp_path: Path) -> None:
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("precious")
    (target / "thesis.tex").write_text("more precious")
    with pytest.raises(ConfigError, match=r"notes\.txt.*thesis\.tex"):
        prepare_output_dir(target, overwrite=True)
    assert (target / "notes.txt").read_text() == "precious"


def test_overwrite_replaces_a_tokenloom_dataset_and_an_empty_directory(native: Path, tmp_path: Path) -> None:
    prepare_output_dir(native, overwrite=True)
    assert [p.name for p in native.iterdir()] == [".tokenloom-writing"]
    empty = tmp_path / "empty"
    empty.mkdir()
    prepare_output_dir(empty, overwrite=True)


def test_cli_overwrite_of_a_foreign_directory_names_its_files(native: Path, tmp_path: Path) -> None:
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("precious")
    result = CliRunner().invoke(convert, [str(native), str(target), "--to", "native", "--overwrite", "--no-progress"])
    assert result.exit_code == 1
    assert "notes.txt" in result.output
    assert (target / "notes.txt").read_text() == "precious"


def _megatron_overwrite_refused(native: Path, tmp_path: Path, suffix: str, mine: str, match: str) -> None:
    """A file of ours at the megatron prefix tmp_path/m/data + suffix: --overwrite refuses and leaves it as it was."""
    prefix = tmp_path / "m" / "data"
    prefix.parent.mkdir()
    Path(f"{prefix}{suffix}").write_text(mine)
    with pytest.raises(ConfigError, match=match):
        convert_dataset(native, prefix, to="megatron", writer_options={"overwrite": True})
    assert Path(f"{prefix}{suffix}").read_text() == mine


def test_megatron_overwrite_refuses_an_idx_that_is_not_megatron(native: Path, tmp_path: Path) -> None:
    _megatron_overwrite_refused(native, tmp_path, ".idx", "my own index of something", "not a Megatron index")
    convert_dataset(native, tmp_path / "m" / "other", to="megatron")
    convert_dataset(native, tmp_path / "m" / "other", to="megatron", writer_options={"overwrite": True})


def test_megatron_overwrite_refuses_a_bin_without_its_idx(native: Path, tmp_path: Path) -> None:
    mine = "a file of mine that happens to end in .bin"
    _megatron_overwrite_refused(native, tmp_path, ".bin", mine, "data.bin: it has no .idx")


def test_packed_overwrite_replaces_a_pbin_but_never_another_file(native: Path, tmp_path: Path) -> None:
    mine = tmp_path / "notes.pbin"
    mine.write_text("text of mine, not a .pbin")
    result = CliRunner().invoke(
        convert, [str(native), str(mine), "--to", "packed", "--overwrite", "--no-progress", "--drop-overlap-prefix"]
    )
    assert result.exit_code == 1 and "refusing to overwrite notes.pbin" in result.output, result.output
    assert mine.read_text() == "text of mine, not a .pbin"
    packed = tmp_path / "data.pbin"
    convert_dataset(native, packed, to="packed")
    convert_dataset(native, packed, to="packed", writer_options={"overwrite": True})  # a real .pbin is replaced
    assert [len(e) for e in open_dataset(packed)] == [3, 5, 8]


@pytest.mark.parametrize("to", ["megatron", "packed", "native"])
def test_a_failed_convert_leaves_no_empty_directories(native: Path, tmp_path: Path, to: str) -> None:
    with NativeWriter(tmp_path / "windows", dtype="uint16", vocab_size=1000, eos_id=0) as writer:
        writer.add(np.array([1, 2, 3]))
        writer.add(np.array([3, 4]), overlap_prefix=1)  # Megatron and .pbin cannot store it
    writer_dtype = ["--dtype", "uint8"] if to == "native" else []  # native stores it: fail on the ids instead
    if to == "native":
        with NativeWriter(tmp_path / "wide", dtype="uint16", vocab_size=1000, eos_id=0) as writer:
            writer.add(np.array([999, 0]))
    source = tmp_path / ("wide" if to == "native" else "windows")
    target = tmp_path / "new" / "deeper" / ("data.pbin" if to == "packed" else "data")
    result = CliRunner().invoke(convert, [str(source), str(target), "--to", to, "--no-progress", *writer_dtype])
    assert result.exit_code == 1, result.output
    assert not (tmp_path / "new").exists(), sorted(p.name for p in (tmp_path / "new").rglob("*"))


def test_a_dtype_too_narrow_for_the_ids_says_to_widen_the_dtype(tmp_path: Path) -> None:
    with NativeWriter(tmp_path / "wide", dtype="uint16", vocab_size=1000, eos_id=0) as writer:
        writer.add(np.array([999, 0]))
    args = [str(tmp_path / "wide"), str(tmp_path / "narrow"), "--to", "native", "--dtype", "uint8", "--no-progress"]
    result = CliRunner().invoke(convert, args)
    assert result.exit_code == 1 and "TokenRangeError" in result.output
    assert "dtype uint8 holds ids up to 255; choose a wider one" in result.output
    assert "re-tokenize" not in result.output  # the vocabulary is fine: only the dtype is wrong
