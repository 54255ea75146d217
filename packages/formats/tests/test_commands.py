"""`tokenloom validate`, `inspect` and `convert`, through click's CliRunner, and the convert API."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenloom.formats import open_dataset, open_writer
from tokenloom.formats._convert import convert_dataset, iter_batches
from tokenloom.formats.cli import group as _cli
from tokenloom.formats.cli.commands import convert, inspect, validate

DOCS = [[5, 6, 0], [7, 0], [1, 2, 3, 4, 0], [9, 9, 9, 9, 9, 9, 0]]
OVERLAPS = [0, 1, 2, 0]


def native(path: Path, *, overlaps=None, shard_size_tokens=None) -> Path:
    with open_writer(
        path, format="native", dtype="uint16", vocab_size=100, eos_id=0, shard_size_tokens=shard_size_tokens
    ) as writer:
        for i, doc in enumerate(DOCS):
            writer.add(doc, overlap_prefix=0 if overlaps is None else overlaps[i])
    return path


def entries(ds) -> list[list[int]]:
    return [ds[i].tolist() for i in range(len(ds))]


def run(command, *args: object):
    return CliRunner().invoke(command, [str(a) for a in args], catch_exceptions=False)


def test_commands_are_installed_entry_points() -> None:
    group = _cli.main
    assert {"validate", "inspect", "convert"} <= set(group.list_commands(None))  # type: ignore[arg-type]
    assert group.get_command(None, "convert") is convert  # type: ignore[arg-type]


@pytest.mark.parametrize("command", [validate, inspect, convert])
def test_every_command_has_help_with_an_example(command) -> None:
    result = run(command, "--help")
    assert result.exit_code == 0
    assert "Example" in result.output
    assert "tokenloom " + command.name in result.output


def test_validate_clean_dataset_prints_summary_and_snippet(tmp_path: Path) -> None:
    root = native(tmp_path / "ds", shard_size_tokens=6)
    result = run(validate, root, "--seq-len", "3")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "format     native" in lines
    assert "entries    4" in lines
    assert "documents  unknown" in lines  # no tokenize record: source documents are not known
    assert "tokens     17" in lines
    assert "vocab      100" in lines
    assert "problems   none (fast validation)" in lines
    ds = open_dataset(root)
    expected = sum(int(n) // 4 for n in ds.shard_num_tokens)
    assert ds.num_shards > 1 and expected != 17 // 4  # counted per shard, not over the whole stream
    assert any(line.startswith(f"# len(windows) == {expected}: sum over shards") for line in lines)
    assert f"tokens = open_dataset({str(root.resolve())!r}, format='native', dtype='uint16')" in lines
    assert "windows = MemoryMappedDataset(tokens, seq_len=3)" in lines
    assert "data:" not in lines  # not a bucket (ROOT/train/<bucket>): no curriculum block


def test_validate_snippet_reopens_the_dataset_as_printed(tmp_path: Path) -> None:
    """The snippet's open_dataset line, run as printed, opens the same data (MemoryMappedDataset is
    exercised in tokenloom-datasets' tests, which may import it)."""
    (tmp_path / "raw").mkdir()
    np.array([1, 2, 3, 0, 4, 0], dtype="<u2").tofile(tmp_path / "raw" / "part_0.bin")
    result = run(validate, tmp_path / "raw", "--format", "flat", "--dtype", "uint16", "--seq-len", "2")
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("tokens = open_dataset(")]
    scope: dict[str, object] = {"open_dataset": open_dataset}
    exec(line, scope)
    assert scope["tokens"].tokens(0, 6).tolist() == [1, 2, 3, 0, 4, 0]  # type: ignore[attr-defined]


def test_validate_problem_exits_1_with_the_named_error(tmp_path: Path) -> None:
    root = native(tmp_path / "ds")
    data = root / "shard_00000.bin"
    raw = bytearray(data.read_bytes())
    raw[0] ^= 1
    data.write_bytes(bytes(raw))
    assert run(validate, root).exit_code == 0  # fast validation does not read data files
    result = run(validate, root, "--deep")
    assert result.exit_code == 1
    assert "problems   1" in result.output
    assert "ChecksumError" in result.output and "shard_00000.bin" in result.output


def test_validate_unknown_layout_and_raw_shards_with_options(tmp_path: Path) -> None:
    (tmp_path / "raw").mkdir()
    np.array([1, 2, 3, 0], dtype="<u2").tofile(tmp_path / "raw" / "part_0.bin")
    result = run(validate, tmp_path / "raw")
    assert result.exit_code == 1
    assert "no reader recognises" in result.output
    result = run(validate, tmp_path / "raw", "--format", "flat", "--dtype", "uint16", "--seq-len", "1")
    assert result.exit_code == 0, result.output
    assert "# len(windows) == 2: " in result.output


def test_inspect_table_and_json(tmp_path: Path) -> None:
    root = native(tmp_path / "ds")
    table = run(inspect, root)
    assert table.exit_code == 0
    assert "lengths    min 2  p50 4  p90 6  p99 7  max 7  mean 4.2" in table.output
    result = run(inspect, root, "--json")
    facts = orjson.loads(result.output)
    lengths = np.array([len(d) for d in DOCS])
    assert facts["entries"] == 4 and facts["tokens"] == 17 and facts["dtype"] == "uint16"
    assert facts["lengths"]["p90"] == round(float(np.percentile(lengths, 90)), 2)
    assert facts["lengths"]["max"] == 7


def test_inspect_plot_without_matplotlib_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = native(tmp_path / "ds")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    result = run(inspect, root, "--plot", tmp_path / "h.png")
    assert result.exit_code == 2  # an installation problem, not bad data
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert 'pip install "tokenloom-formats[plot]"' in result.output
    assert not (tmp_path / "h.png").exists()


def test_inspect_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    root = native(tmp_path / "ds")
    result = run(inspect, root, "--plot", tmp_path / "h.png")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_convert_round_trip_native_megatron_flat_native(tmp_path: Path) -> None:
    root = native(tmp_path / "ds")
    steps = [
        (root, tmp_path / "flat", "flat"),
        (tmp_path / "flat", tmp_path / "meg" / "train", "megatron"),
        (tmp_path / "meg" / "train", tmp_path / "nat2", "native"),
    ]
    for source, target, to in steps:
        result = run(convert, source, target, "--to", to, "--chunk-tokens", "5", "--no-progress")
        assert result.exit_code == 0, result.output
        assert "converted 4 entries, 17 tokens" in result.output
        assert entries(open_dataset(target)) == DOCS
    # the flat manifest carries vocab size and EOS id (which give back the boundaries); megatron's sidecar too
    assert (open_dataset(tmp_path / "flat").vocab_size, open_dataset(tmp_path / "flat").eos_id) == (100, 0)
    assert (open_dataset(tmp_path / "nat2").vocab_size, open_dataset(tmp_path / "nat2").eos_id) == (100, 0)


def test_convert_keeps_overlap_prefixes_where_the_target_stores_them(tmp_path: Path) -> None:
    root = native(tmp_path / "ds", overlaps=OVERLAPS)
    result = run(convert, root, tmp_path / "copy", "--to", "native", "--no-progress")
    assert result.exit_code == 0, result.output
    copy = open_dataset(tmp_path / "copy")
    assert copy.overlap_prefix.tolist() == OVERLAPS
    assert (copy.vocab_size, copy.eos_id) == (100, 0)
    result = run(convert, root, tmp_path / "m" / "d", "--to", "megatron", "--no-progress")
    assert result.exit_code == 1
    assert "cannot store overlap prefixes" in result.output
    assert not (tmp_path / "m" / "d.idx").exists()
    result = run(convert, root, tmp_path / "m" / "d", "--to", "megatron", "--drop-overlap-prefix", "--no-progress")
    assert result.exit_code == 0, result.output
    assert entries(open_dataset(tmp_path / "m" / "d")) == DOCS


def test_convert_option_errors(tmp_path: Path) -> None:
    root = native(tmp_path / "ds")
    result = run(convert, root, tmp_path / "x", "--to", "parquet")
    assert result.exit_code == 1 and "writable: [" in result.output and "'megatron'" in result.output
    result = run(convert, root, tmp_path / "x", "--to", "megatron", "--shard-size-tokens", "5")
    assert result.exit_code == 1 and "--shard-size-tokens is not an option of the megatron writer" in result.output
    native(tmp_path / "busy")
    assert run(convert, root, tmp_path / "busy", "--to", "native").exit_code == 1
    assert run(convert, root, tmp_path / "busy", "--to", "native", "--overwrite", "--no-progress").exit_code == 0


def test_convert_target_dtype_and_sharding(tmp_path: Path) -> None:
    root = native(tmp_path / "ds")
    result = run(convert, root, tmp_path / "wide", "--to", "native", "--dtype", "int32", "--shard-size-tokens", "4")
    assert result.exit_code == 0, result.output
    wide = open_dataset(tmp_path / "wide")
    assert wide.dtype == np.dtype("int32") and wide.num_shards > 1
    assert entries(wide) == DOCS
    result = run(convert, root, tmp_path / "narrow", "--to", "native", "--dtype", "uint8", "--no-progress")
    assert result.exit_code == 0  # every id fits in uint8
    assert entries(open_dataset(tmp_path / "narrow")) == DOCS


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 9), max_size=30),
    shard_size=st.integers(1, 20),
    chunk=st.integers(1, 25),
)
def test_batches_cover_every_entry_in_order(tmp_path_factory, lengths, shard_size, chunk) -> None:
    root = tmp_path_factory.mktemp("ds") / "ds"
    docs = [list(range(1, n + 1)) for n in lengths]
    with open_writer(root, format="native", dtype="uint16", shard_size_tokens=shard_size) as writer:
        for doc in docs:
            writer.add(doc)
    ds = open_dataset(root)
    seen: list[list[int]] = []
    for tokens, batch_lengths, overlaps in iter_batches(ds, chunk):
        assert len(overlaps) == len(batch_lengths) >= 1
        assert len(tokens) <= max(chunk, int(batch_lengths.max()))
        starts = np.concatenate([[0], np.cumsum(batch_lengths)])
        seen += [tokens[a:b].tolist() for a, b in itertools.pairwise(starts)]
    assert seen == docs


def test_convert_api_returns_counts(tmp_path: Path) -> None:
    root = native(tmp_path / "ds")
    progress: list[int] = []
    result = convert_dataset(root, tmp_path / "m" / "d", to="megatron", on_progress=progress.append)
    assert (result.source_format, result.target_format, result.entries, result.tokens) == ("native", "megatron", 4, 17)
    assert sum(progress) == 17


def test_inspect_plot_uses_a_log_axis_and_names_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.axes

    seen: dict[str, str] = {}
    original_yscale, original_xlabel = matplotlib.axes.Axes.set_yscale, matplotlib.axes.Axes.set_xlabel

    def yscale(self, value, **kw):
        seen["yscale"] = value
        return original_yscale(self, value, **kw)

    def xlabel(self, value, **kw):
        seen["xlabel"] = value
        return original_xlabel(self, value, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "set_yscale", yscale)
    monkeypatch.setattr(matplotlib.axes.Axes, "set_xlabel", xlabel)
    root = native(tmp_path / "ds")
    result = run(inspect, root, "--plot", tmp_path / "h.png")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "h.png").stat().st_size > 0
    assert seen == {"yscale": "log", "xlabel": "entry length (tokens)"}


def test_convert_verifies_the_source_first_unless_told_not_to(tmp_path: Path) -> None:
    """Found by tools/fuzz/catalogue.py: a byte flipped inside a shard (still a valid id) was copied silently,
    although the manifest holds the checksum that says so."""
    root = native(tmp_path / "ds")
    shard = next(root.glob("*.bin"))
    raw = bytearray(shard.read_bytes())
    raw[2] ^= 0x01  # token 5 -> 4: inside the vocabulary, caught only by the checksum
    shard.write_bytes(bytes(raw))
    result = run(convert, root, tmp_path / "copy", "--to", "native", "--no-progress")
    assert result.exit_code == 1
    assert result.output.startswith("Error: ChecksumError: ") and shard.name in result.output
    assert not (tmp_path / "copy").exists()
    result = run(convert, root, tmp_path / "copy", "--to", "native", "--no-verify", "--no-progress")
    assert result.exit_code == 0, result.output
    assert entries(open_dataset(tmp_path / "copy"))[0] != DOCS[0]  # copied as it is, on request


@pytest.mark.parametrize("command", ["validate", "inspect", "convert"])
def test_a_bad_path_hint_does_not_advise_the_command_being_run(tmp_path: Path, command: str) -> None:
    from tokenloom.formats.cli import main

    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "notes.txt").write_text("not tokens")
    for path, expected in (
        (tmp_path / "typo" / "data", f"the nearest existing directory is {tmp_path} (it holds real)"),
        (tmp_path / "real", "the directory holds notes.txt"),
    ):
        argv = [command, str(path)] + (["out", "--to", "native"] if command == "convert" else [])
        result = CliRunner().invoke(main, argv)
        assert result.exit_code == 1
        assert expected in result.output
        assert "tokenloom validate" not in result.output  # the old hint sent validate's user to validate
