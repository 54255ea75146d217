"""tokenize --overwrite never deletes its own inputs or a user's unrelated files (issue #11, data loss)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from tokenloom.tokenize._commands import tokenize


def _args(inp: Path, out: Path, tokenizer: Path, *extra: str) -> list[str]:
    return [
        "--input-dir", str(inp), "--output-dir", str(out), "--tokenizer", str(tokenizer),
        "--num-workers", "0", "--no-progress", *extra,
    ]  # fmt: skip


@pytest.mark.parametrize("fmt", ["native", "megatron"])
def test_output_dir_equal_to_input_dir_keeps_the_inputs(
    tiny_tokenizer: Path, text_corpus: Callable[[int], Path], fmt: str
) -> None:
    inp = text_corpus(20)
    before = (inp / "a.jsonl").read_bytes()
    result = CliRunner().invoke(tokenize, _args(inp, inp, tiny_tokenizer, "--overwrite", "--format", fmt))
    assert result.exit_code == 1, result.output
    assert "input" in result.output
    assert (inp / "a.jsonl").read_bytes() == before


def test_output_dir_containing_the_inputs_is_refused(
    tmp_path: Path, tiny_tokenizer: Path, text_corpus: Callable[[int], Path]
) -> None:
    inp = text_corpus(5)
    result = CliRunner().invoke(tokenize, _args(inp, tmp_path, tiny_tokenizer, "--overwrite"))
    assert result.exit_code == 1, result.output
    assert (inp / "a.jsonl").exists()


def test_output_dir_symlinked_to_the_input_dir_is_refused(
    tmp_path: Path, tiny_tokenizer: Path, text_corpus: Callable[[int], Path]
) -> None:
    inp = text_corpus(5)
    link = tmp_path / "out-link"
    link.symlink_to(inp, target_is_directory=True)
    result = CliRunner().invoke(tokenize, _args(inp, link, tiny_tokenizer, "--overwrite"))
    assert result.exit_code == 1, result.output
    assert (inp / "a.jsonl").exists()


def test_output_dir_inside_the_input_dir_is_fine(tiny_tokenizer: Path, text_corpus: Callable[[int], Path]) -> None:
    inp = text_corpus(5)
    result = CliRunner().invoke(tokenize, _args(inp, inp / "tokens", tiny_tokenizer))
    assert result.exit_code == 0, result.output


def test_overwrite_of_a_foreign_directory_is_refused_naming_its_files(
    tmp_path: Path, tiny_tokenizer: Path, text_corpus: Callable[[int], Path]
) -> None:
    inp = text_corpus(5)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("precious")
    for fmt in ("native", "flat"):
        result = CliRunner().invoke(tokenize, _args(inp, out, tiny_tokenizer, "--overwrite", "--format", fmt))
        assert result.exit_code == 1, result.output
        assert "notes.txt" in result.output
        assert (out / "notes.txt").read_text() == "precious"


def test_pack_onto_its_own_input_is_refused(tiny_tokenizer: Path, text_corpus: Callable[[int], Path]) -> None:
    from tokenloom.tokenize._commands import pack

    inp = text_corpus(5)
    source = inp / "a.jsonl"
    before = source.read_bytes()
    args = [str(source), "--output", str(source), "--tokenizer", str(tiny_tokenizer), "--num-workers", "0"]
    result = CliRunner().invoke(pack, [*args, "--overwrite"])
    assert result.exit_code == 1, result.output
    assert "is the source" in result.output
    assert source.read_bytes() == before
