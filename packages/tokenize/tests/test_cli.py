"""The tokenize and index commands."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from click.testing import CliRunner

from tokenloom.formats import open_dataset
from tokenloom.tokenize._commands import index, tokenize


def test_help_shows_an_example() -> None:
    for command in (tokenize, index):
        result = CliRunner().invoke(command, ["--help"])
        assert result.exit_code == 0
        assert "Example:" in result.output and "tokenloom " in result.output
    assert "--overlap-size" in CliRunner().invoke(tokenize, ["--help"]).output


def test_tokenize_prints_a_summary(tmp_path: Path, tiny_tokenizer: Path, jsonl_dir: Callable[..., Path]) -> None:
    corpus = jsonl_dir({"a.jsonl": [{"text": "one two"}, {"text": 3}, {"text": "four"}]})
    args = ["--input-dir", str(corpus), "--output-dir", str(tmp_path / "out"), "--tokenizer", str(tiny_tokenizer)]
    args += ["--num-workers", "0", "--no-progress"]
    failed = CliRunner().invoke(tokenize, args)
    assert failed.exit_code == 1
    assert "RecordError" in failed.output and "a.jsonl" in failed.output and "record 2" in failed.output
    result = CliRunner().invoke(tokenize, [*args, "--on-error", "skip"])
    assert result.exit_code == 0, result.output
    assert "documents 2" in result.output and "skipped 1 bad records: non_string_field 1" in result.output
    assert len(open_dataset(tmp_path / "out")) == 2
    again = CliRunner().invoke(tokenize, [*args, "--on-error", "skip"])
    assert "already complete" in again.output


def test_bad_option_is_a_clean_error(tmp_path: Path, jsonl_dir: Callable[..., Path]) -> None:
    corpus = jsonl_dir({"a.jsonl": [{"text": "x"}]})
    args = ["--input-dir", str(corpus), "--output-dir", str(tmp_path / "o"), "--seq-len", "8", "--overlap-size", "5"]
    result = CliRunner().invoke(tokenize, args)
    assert result.exit_code == 1 and "ConfigError" in result.output and "overlap_size" in result.output


def test_index_command(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"text": "a"}\n{"text": "b"}\n')
    result = CliRunner().invoke(index, [str(path)])
    assert result.exit_code == 0 and "2 lines" in result.output
    assert (tmp_path / "d.jsonl.idx.npy").exists()


def test_isolated_env_has_no_torch() -> None:
    """Under tox this package's env holds only its own dependencies."""
    import importlib.util
    import os

    import pytest

    if os.environ.get("TOKENLOOM_ISOLATED_ENV") != "tokenize":
        pytest.skip("only meaningful inside the isolated tox env for tokenloom-tokenize")
    assert importlib.util.find_spec("torch") is None


def test_remote_output_dir_is_refused_not_written_locally(
    tmp_path: Path, tiny_tokenizer: Path, jsonl_dir: Callable[..., Path], monkeypatch
) -> None:
    corpus = jsonl_dir({"a.jsonl": [{"text": "one two"}]})
    monkeypatch.chdir(tmp_path)
    args = ["--input-dir", str(corpus), "--output-dir", "s3://bucket/tok", "--tokenizer", str(tiny_tokenizer)]
    result = CliRunner().invoke(tokenize, [*args, "--num-workers", "0", "--no-progress", "--format", "megatron"])
    assert result.exit_code != 0  # native output to s3:// is written (test_remote_output.py); megatron is not yet
    assert "remote tokenize output in format megatron is not supported yet: 's3://bucket/tok'" in result.output
    assert not (tmp_path / "s3:").exists()
