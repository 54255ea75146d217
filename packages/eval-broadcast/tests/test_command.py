"""``tokenloom eval-cache``: prebuild the cache that a training job's broadcast_eval_set then reads."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from tokenloom.eval_broadcast import HFEvalSource, PathEvalSource, broadcast_eval_set
from tokenloom.eval_broadcast._command import eval_cache
from tokenloom.formats import open_writer

pytest.importorskip("datasets")


def test_prebuilt_hf_cache_is_what_the_job_reads(tokenizer_dir, jsonl, tmp_path):
    args = ["--data-files", str(jsonl), "--tokenizer", str(tokenizer_dir), "--seq-len", "6"]
    result = CliRunner().invoke(eval_cache, [*args, "--cache-dir", str(tmp_path / "c"), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "built and cached: " in result.output and "x 7" in result.output
    source = HFEvalSource("json", data_files=str(jsonl), split="train", tokenizer=str(tokenizer_dir))
    evalset = broadcast_eval_set(source, seq_len=6, cache_dir=tmp_path / "c")
    assert evalset.origin == "cache" and source.documents_tokenized == 0
    again = CliRunner().invoke(eval_cache, [*args, "--cache-dir", str(tmp_path / "c"), "--no-progress"])
    assert again.exit_code == 0 and "already cached, verified: " in again.output


def test_path_source_and_errors(tmp_path):
    with open_writer(tmp_path / "val", dtype="uint16", vocab_size=10, eos_id=9) as writer:
        writer.add(np.array([1, 2, 9, 3, 4, 9]))
    result = CliRunner().invoke(
        eval_cache, ["--path", str(tmp_path / "val"), "--seq-len", "2", "--cache-dir", str(tmp_path / "c")]
    )
    assert result.exit_code == 0, result.output
    assert broadcast_eval_set(PathEvalSource(tmp_path / "val"), seq_len=2, cache_dir=tmp_path / "c").origin == "cache"
    missing = CliRunner().invoke(eval_cache, ["--seq-len", "2", "--cache-dir", str(tmp_path / "c")])
    assert missing.exit_code == 2 and "--tokenizer" in missing.output
    dropped = CliRunner().invoke(
        eval_cache,
        ["--path", str(tmp_path / "val"), "--seq-len", "3", "--cache-dir", str(tmp_path / "c"), "--drop-remainder"],
    )
    assert dropped.exit_code == 0 and "rows 1 x 4  tokens 4  padding 0" in dropped.output
    broken = CliRunner().invoke(
        eval_cache,
        ["--data-files", str(tmp_path / "nope.jsonl"), "--tokenizer", "tok", "--seq-len", "2", "--cache-dir", "c2"],
    )
    assert broken.exit_code == 1 and "does not exist" in broken.output


def test_cache_dir_inside_the_source_is_refused_and_errors_name_their_class(tmp_path):
    """Found by tools/fuzz/catalogue.py: --cache-dir = --path wrote cache entries into the source dataset,
    and errors printed without their class name (the EvalBuildError wrapper hid the source's error)."""
    with open_writer(tmp_path / "val", dtype="uint16", vocab_size=10, eos_id=9) as writer:
        writer.add(np.array([1, 2, 9, 3, 4, 9]))
    before = sorted(p.name for p in (tmp_path / "val").iterdir())
    for cache in (tmp_path / "val", tmp_path / "val" / "cache"):
        result = CliRunner().invoke(
            eval_cache, ["--path", str(tmp_path / "val"), "--seq-len", "2", "--cache-dir", str(cache)]
        )
        assert result.exit_code == 1, result.output
        assert result.output.startswith("Error: ConfigError: --cache-dir") and "the source" in result.output
    assert sorted(p.name for p in (tmp_path / "val").iterdir()) == before
    broken = CliRunner().invoke(
        eval_cache,
        ["--data-files", str(tmp_path / "nope.jsonl"), "--tokenizer", "tok", "--seq-len", "2", "--cache-dir", "c2"],
    )
    assert broken.exit_code == 1 and broken.output.strip().startswith("Error: MissingFileError: "), broken.output


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_a_bad_tokenizer_is_one_named_line(tokenizer_dir, jsonl, tmp_path, damage):
    """Found by tools/fuzz/catalogue.py: the error named a JSONDecodeError / HFValidationError, no DataError."""
    import shutil

    tok = tmp_path / "tok"
    if damage == "corrupt":
        shutil.copytree(tokenizer_dir, tok)
        (tok / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    args = ["--data-files", str(jsonl), "--tokenizer", str(tok), "--seq-len", "6", "--cache-dir", str(tmp_path / "c")]
    result = CliRunner().invoke(eval_cache, [*args, "--no-progress"])
    assert result.exit_code == 1
    expected = (
        "Error: ConfigError: the tokenizer could not be loaded" if damage == "corrupt" else "Error: MissingFileError"
    )
    assert result.output.strip().startswith(expected), result.output
    assert ("Traceback" not in result.output and not (tmp_path / "c").exists()) or not any((tmp_path / "c").iterdir())


def test_a_wrapped_build_error_names_its_innermost_cause(tokenizer_dir, tmp_path):
    """load_dataset wraps the JSON parse error in DatasetGenerationError: the one line carries the parse error."""
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": "unterminated\n')
    args = ["--data-files", str(tmp_path / "bad.jsonl"), "--tokenizer", str(tokenizer_dir), "--seq-len", "4"]
    result = CliRunner().invoke(eval_cache, [*args, "--cache-dir", str(tmp_path / "c"), "--no-progress"])
    assert result.exit_code == 1
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("Error: EvalBuildError: building the eval set failed: DatasetGenerationError"), line
    assert "(cause: " in line  # the parser error underneath, not only "an error occurred"


@pytest.mark.parametrize("kind", ["fifo", "symlink-loop"])
def test_a_data_file_that_is_not_a_regular_file_is_named_as_such(tokenizer_dir, tmp_path, kind):
    """Found by tools/fuzz/catalogue.py: a FIFO or a symlink loop was reported as a file that "does not exist"."""
    import os

    target = tmp_path / "b.jsonl"
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to(tmp_path / "c.jsonl")
        (tmp_path / "c.jsonl").symlink_to(target)
    args = ["--data-files", str(target), "--tokenizer", str(tokenizer_dir), "--seq-len", "4"]
    result = CliRunner().invoke(eval_cache, [*args, "--cache-dir", str(tmp_path / "c"), "--no-progress"])
    assert result.exit_code == 1
    assert result.output.strip().startswith("Error: UnsafePathError: ") and "not a regular file" in result.output


def test_prebuilt_cache_with_compat_kempnerforge_is_what_a_skipping_job_reads(tokenizer_dir, tmp_path):
    jsonl = tmp_path / "val.jsonl"
    jsonl.write_text('{"text": "a cat"}\n{"text": ""}\n{"text": "the dog sat"}\n' * 4)
    args = ["--data-files", str(jsonl), "--tokenizer", str(tokenizer_dir), "--seq-len", "3", "--no-progress"]
    result = CliRunner().invoke(eval_cache, [*args, "--compat", "kempnerforge", "--cache-dir", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    options: dict[str, Any]
    for options in ({"skip_empty": True}, {"compat": "kempnerforge"}):
        source = HFEvalSource("json", data_files=str(jsonl), split="train", tokenizer=str(tokenizer_dir), **options)
        assert broadcast_eval_set(source, seq_len=3, cache_dir=tmp_path / "c").origin == "cache"
    keeping = HFEvalSource("json", data_files=str(jsonl), split="train", tokenizer=str(tokenizer_dir))
    assert broadcast_eval_set(keeping, seq_len=3, cache_dir=tmp_path / "c").origin == "built"
    kept = CliRunner().invoke(eval_cache, [*args, "--keep-empty", "--cache-dir", str(tmp_path / "c")])
    assert kept.exit_code == 0 and "already cached, verified: " in kept.output
