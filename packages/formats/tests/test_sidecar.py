"""EOS id, vocab size and tokenizer fingerprint survive megatron and packed (their sidecar), and convert sets them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tokenloom.formats import ConfigError, FormatError, convert_dataset, open_dataset, open_writer
from tokenloom.formats.cli.commands import convert

DOCS = [[5, 6, 0], [7, 0], [1, 2, 3, 4, 0], [9, 9, 9, 9, 9, 9, 0]]
FINGERPRINT = "tok-0123456789abcdef"


def _native(path: Path) -> Path:
    with open_writer(
        path, format="native", dtype="uint16", vocab_size=100, eos_id=0, tokenizer_fingerprint=FINGERPRINT
    ) as writer:
        for doc in DOCS:
            writer.add(doc)
    return path


def _facts(path: Path) -> tuple[int | None, int | None, str | None, list[list[int]]]:
    ds = open_dataset(path)
    return ds.eos_id, ds.vocab_size, ds.tokenizer_fingerprint, [ds[i].tolist() for i in range(len(ds))]


@pytest.mark.parametrize(("to", "middle", "sidecar"), [
    ("megatron", "mid/data", "mid/data.tokenloom.json"),
    ("packed", "mid/data.pbin", "mid/data.pbin.tokenloom.json"),
])  # fmt: skip
def test_native_to_x_to_native_keeps_eos_vocab_and_tokenizer(
    tmp_path: Path, to: str, middle: str, sidecar: str
) -> None:
    source = _native(tmp_path / "native")
    convert_dataset(source, tmp_path / middle, to=to)
    assert (tmp_path / sidecar).is_file()
    assert _facts(tmp_path / middle) == (0, 100, FINGERPRINT, DOCS)
    result = CliRunner().invoke(
        convert, [str(tmp_path / middle), str(tmp_path / "back"), "--to", "native", "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    assert _facts(tmp_path / "back") == (0, 100, FINGERPRINT, DOCS)


@pytest.mark.parametrize(("to", "name"), [("megatron", "m/data"), ("packed", "p.pbin")])
def test_convert_sets_eos_and_vocab_where_the_source_has_none(tmp_path: Path, to: str, name: str) -> None:
    bare = tmp_path / name
    with open_writer(bare, format=to, dtype="uint16") as writer:  # as another tool would write it: nothing recorded
        for doc in DOCS:
            writer.add(doc)
    assert not Path(str(bare) + ".tokenloom.json").exists()
    assert _facts(bare)[:3] == (None, None, None)
    run = CliRunner().invoke
    result = run(convert, [str(bare), str(tmp_path / "n"), "--to", "native", "--eos-id", "0", "--vocab-size", "100",
                           "--no-progress"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert _facts(tmp_path / "n")[:2] == (0, 100)
    result = run(
        convert, [str(tmp_path / "n"), str(tmp_path / "n2"), "--to", "native", "--eos-id", "7", "--no-progress"]
    )
    assert result.exit_code == 1
    assert "ConfigError" in result.output and "eos_id 7 was given, the source records 0" in result.output
    assert not (tmp_path / "n2").exists()
    result = run(convert, [str(bare), str(tmp_path / "small"), "--to", "native", "--vocab-size", "8", "--no-progress"])
    assert result.exit_code == 1 and "TokenRangeError" in result.output  # the vocab size is checked, not just copied


def test_a_sidecar_beside_other_data_is_a_named_error(tmp_path: Path) -> None:
    source = _native(tmp_path / "native")
    convert_dataset(source, tmp_path / "a.pbin", to="packed")
    with open_writer(tmp_path / "b.pbin", format="packed", dtype="uint16") as writer:
        writer.add([1, 2, 3])
    (tmp_path / "b.pbin.tokenloom.json").write_bytes((tmp_path / "a.pbin.tokenloom.json").read_bytes())
    with pytest.raises(FormatError, match="describes another version of b.pbin") as info:
        open_dataset(tmp_path / "b.pbin")
    assert info.value.path == str(tmp_path / "b.pbin.tokenloom.json")
    with pytest.raises(ConfigError, match="eos_id 5 was given, the sidecar records 0"):
        open_dataset(tmp_path / "a.pbin", eos_id=5)
    assert open_dataset(tmp_path / "a.pbin", eos_id=0).eos_id == 0


def test_overwriting_without_metadata_removes_the_old_sidecar(tmp_path: Path) -> None:
    source = _native(tmp_path / "native")
    convert_dataset(source, tmp_path / "m" / "data", to="megatron")
    with open_writer(tmp_path / "m" / "data", format="megatron", dtype="uint16", overwrite=True) as writer:
        writer.add(np.array([1, 2], dtype=np.uint16))
    assert not (tmp_path / "m" / "data.tokenloom.json").exists()
    assert _facts(tmp_path / "m" / "data") == (None, None, None, [[1, 2]])


@pytest.mark.parametrize(("fmt", "name"), [("packed", b"caf\xe9.pbin"), ("megatron", b"caf\xe9")])
def test_a_file_name_that_is_not_utf8_gets_its_sidecar(tmp_path: Path, fmt: str, name: bytes) -> None:
    """The sidecar names the file it describes; a latin-1 name (as `tokenloom pack x.jsonl --output caf\\xe9.pbin`
    makes) was a bare TypeError from the JSON encoder after the data was written."""
    import os

    target = Path(os.fsdecode(bytes(tmp_path) + b"/" + name))
    with open_writer(target, format=fmt, dtype="uint16", vocab_size=300, eos_id=0) as writer:
        writer.add(np.array([5, 6, 0]))
    opened = open_dataset(target)
    assert (opened.eos_id, opened.vocab_size, len(opened)) == (0, 300, 1)


@pytest.mark.parametrize(
    ("vocab_size", "eos_id", "says"),
    [
        (0, None, "vocab_size 0"),
        (-5, None, "vocab_size -5"),
        (256, -1, "eos_id -1"),
        (256, 300, "outside its vocab_size"),
    ],
)
def test_a_recorded_vocab_size_or_eos_id_out_of_range_is_a_named_error(tmp_path, vocab_size, eos_id, says):
    """A manifest or sidecar recording an impossible vocab size or EOS id is refused, not trusted (#21 review)."""
    import dataclasses

    from tokenloom.formats import FormatError, open_dataset, open_writer, read_manifest
    from tokenloom.formats.io import write_manifest

    out = tmp_path / "native"
    with open_writer(out, format="native", dtype="uint16", vocab_size=256, eos_id=0) as writer:
        writer.add([5, 6, 0])
    manifest = dataclasses.replace(read_manifest(out), vocab_size=vocab_size, eos_id=eos_id)
    write_manifest(out, manifest)  # a valid checksum over the impossible values
    with pytest.raises(FormatError, match=says):
        open_dataset(out)
