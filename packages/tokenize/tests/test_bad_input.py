"""Every bad-input case: RecordError(file, line) with on_error=raise, counted per kind with skip."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tokenloom.formats import ConfigError, MissingFileError, RecordError, open_dataset
from tokenloom.tokenize import TokenizeConfig, tokenize

GOOD = [{"text": "first good document"}, {"text": "second good document"}]


def config(tokenizer: Path, input_dir: Path, out: Path, **kw: Any) -> TokenizeConfig:
    return TokenizeConfig(input_dir=input_dir, output_dir=out, tokenizer=str(tokenizer), num_workers=0, **kw)


def lines(*records: object) -> bytes:
    return b"".join((r if isinstance(r, bytes) else orjson.dumps(r)) + b"\n" for r in records)


def truncated_gzip() -> bytes:
    """Many distinct records (so the stream is long), cut in the middle."""
    data = gzip.compress(lines(*({"text": f"record {i} " + "ab" * (i % 53)} for i in range(5000))), mtime=0)
    return data[: len(data) // 2]


# (file name, bytes, line of the error, kind)
CASES = [
    ("malformed.jsonl", lines(GOOD[0], b'{"text": "unterminated', GOOD[1]), 2, "malformed_json"),
    ("blank.jsonl", lines(GOOD[0], b"", GOOD[1]), 2, "malformed_json"),
    ("array.jsonl", lines(GOOD[0], [1, 2], GOOD[1]), 2, "not_an_object"),
    ("missing.jsonl", lines(GOOD[0], GOOD[1], {"body": "no text field"}), 3, "missing_field"),
    ("nonstring.jsonl", lines({"text": 5}, *GOOD), 1, "non_string_field"),
    ("null.jsonl", lines(GOOD[0], {"text": None}), 2, "non_string_field"),
    ("latin1.jsonl", lines(GOOD[0], b'{"text": "caf\xe9"}', GOOD[1]), 2, "invalid_utf8"),
    ("long.jsonl", lines(GOOD[0], {"text": "x" * 500}, GOOD[1]), 2, "line_too_long"),
    ("empty.jsonl", b"", 0, "empty_file"),
    ("empty.parquet", b"", 0, "empty_file"),  # a 0-byte row file is an empty file too, not a TypeError
    ("cut.jsonl.gz", truncated_gzip(), None, "truncated_gzip"),
]


@pytest.fixture(params=CASES, ids=[c[3] + ":" + c[0] for c in CASES])
def case(request: pytest.FixtureRequest, jsonl_dir: Callable[..., Path]) -> tuple[Path, str, bytes, int | None, str]:
    """Each case as an input dir (a_good.jsonl, then the case's file), its file name, bytes, line and kind."""
    name, data, line, kind = request.param
    return jsonl_dir({"a_good.jsonl": GOOD}, raw={name: data}), name, data, line, kind


def test_raise_names_the_file_and_line_and_publishes_nothing(
    tmp_path: Path, tiny_tokenizer: Path, case: tuple[Path, str, bytes, int | None, str]
) -> None:
    input_dir, name, _, line, kind = case
    out = tmp_path / "out"
    with pytest.raises(RecordError) as info:
        # tiny shards: a_good.jsonl publishes some before the bad file is reached
        tokenize(config(tiny_tokenizer, input_dir, out, max_line_bytes=200, shard_size_tokens=4, chunk_lines=10**6))
    err = info.value
    assert err.path == str(input_dir / name)
    assert err.field == kind
    if line is not None:
        assert err.record == line
    else:
        assert err.record is not None and err.record > 1
    assert "--on-error skip" in str(err)
    assert list(out.iterdir()) == []  # the shards of a_good.jsonl were removed again
    with pytest.raises(MissingFileError):
        open_dataset(out, format="native")


def test_skip_counts_each_kind_and_keeps_the_good_records(
    tmp_path: Path, tiny_tokenizer: Path, case: tuple[Path, str, bytes, int | None, str]
) -> None:
    input_dir, _, data, _, kind = case
    summary = tokenize(config(tiny_tokenizer, input_dir, tmp_path / "out", max_line_bytes=200, on_error="skip"))
    assert summary.skipped == {kind: 1}
    assert any(f": {kind}: " in example for example in summary.examples)
    good_in_bad_file = sum(1 for raw in data.splitlines() if raw in {orjson.dumps(g) for g in GOOD})
    if kind == "truncated_gzip":
        assert summary.documents > len(GOOD)  # the lines before the cut are kept
    else:
        assert summary.documents == len(GOOD) + good_in_bad_file
    ds = open_dataset(tmp_path / "out")
    assert len(ds) == summary.documents
    assert ds.metadata["tokenize"]["skipped"] == {kind: 1}


def test_nested_text_field_by_dotted_path(tmp_path: Path, tiny_tokenizer: Path, jsonl_dir: Callable[..., Path]) -> None:
    records = [{"meta": {"body": "nested one"}}, {"meta": {"body": "nested two"}}, {"meta": "flat"}]
    input_dir = jsonl_dir({"n.jsonl": records})
    with pytest.raises(RecordError, match="no field 'meta.body'") as info:
        tokenize(config(tiny_tokenizer, input_dir, tmp_path / "out", text_field="meta.body"))
    assert info.value.record == 3
    summary = tokenize(config(tiny_tokenizer, input_dir, tmp_path / "out2", text_field="meta.body", on_error="skip"))
    assert (summary.documents, summary.skipped) == (2, {"missing_field": 1})


def test_first_error_in_input_order_wins(tmp_path: Path, tiny_tokenizer: Path, jsonl_dir: Callable[..., Path]) -> None:
    """An error the reader finds later (empty file b) never hides an earlier parse error in a."""
    input_dir = jsonl_dir({}, raw={"a.jsonl": lines(GOOD[0], b"{bad"), "b.jsonl": b""})
    with pytest.raises(RecordError) as info:
        tokenize(config(tiny_tokenizer, input_dir, tmp_path / "out", chunk_lines=1))
    assert (Path(info.value.path or "").name, info.value.record) == ("a.jsonl", 2)


def test_no_inputs_and_missing_dir_are_config_errors(tmp_path: Path, tiny_tokenizer: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not an input")
    with pytest.raises(
        ConfigError, match=r"no input files \(\.jsonl, \.jsonl\.gz, \.json\.gz, \.jsonl\.zst, .*\.parquet, \.arrow\)"
    ):
        tokenize(config(tiny_tokenizer, tmp_path / "empty", tmp_path / "out"))
    with pytest.raises(MissingFileError, match="input directory does not exist"):
        tokenize(config(tiny_tokenizer, tmp_path / "nope", tmp_path / "out"))
