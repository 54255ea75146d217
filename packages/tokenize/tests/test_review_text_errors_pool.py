"""Review of issue 36's one unit executor for text units: bad records in files cut into many units, under the
worker pool (--num-workers 2) and in process: skip counts the same and writes the same bytes; raise names the
first bad record in input order (file and line), whichever worker meets which error first."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tokenloom.formats import RecordError
from tokenloom.tokenize import TokenizeConfig, tokenize


def _corpus(jsonl_dir: Callable[..., Path], make_texts: Callable[..., list[str]]) -> Path:
    texts = make_texts(400, seed=9, max_words=40)
    good = [orjson.dumps({"text": t}) for t in texts]
    a = [*good[:150], b"{broken", *good[150:200], orjson.dumps({"text": 5}), *good[200:230]]
    b = [*good[230:300], orjson.dumps({"body": "no text"}), *good[300:], b'{"text": "caf\xe9"}']
    return jsonl_dir({}, raw={"a.jsonl": b"\n".join(a) + b"\n", "b.jsonl": b"\n".join(b) + b"\n"})


def _config(tokenizer: Path, corpus: Path, out: Path, workers: int, **extra: Any) -> TokenizeConfig:
    return TokenizeConfig(
        input_dir=corpus, output_dir=out, tokenizer=str(tokenizer), num_workers=workers, unit_bytes=4000,
        shard_size_tokens=2000, **extra,
    )  # fmt: skip


def test_skip_under_the_pool_counts_and_writes_as_in_process(
    tmp_path: Path, tiny_tokenizer: Path, jsonl_dir, make_texts, output_digest
) -> None:
    corpus = _corpus(jsonl_dir, make_texts)
    one = tokenize(_config(tiny_tokenizer, corpus, tmp_path / "one", 0, on_error="skip"))
    two = tokenize(_config(tiny_tokenizer, corpus, tmp_path / "two", 2, on_error="skip"))
    expected = {"malformed_json": 1, "non_string_field": 1, "missing_field": 1, "invalid_utf8": 1}
    assert one.skipped == expected and two.skipped == expected
    assert one.documents == two.documents == 400
    assert output_digest(tmp_path / "one") == output_digest(tmp_path / "two")


@pytest.mark.parametrize("workers", [0, 2])
def test_raise_names_the_first_bad_record_in_input_order(
    workers: int, tmp_path: Path, tiny_tokenizer: Path, jsonl_dir, make_texts
) -> None:
    corpus = _corpus(jsonl_dir, make_texts)
    assert (corpus / "a.jsonl").stat().st_size > 3 * 4000  # the bad line is in a later unit, not the first
    out = tmp_path / "out"
    with pytest.raises(RecordError) as caught:
        tokenize(_config(tiny_tokenizer, corpus, out, workers))
    assert (Path(caught.value.path or "").name, caught.value.record) == ("a.jsonl", 151), str(caught.value)
    assert caught.value.field == "malformed_json" and "--on-error skip" in str(caught.value)
    assert not (out / "manifest.json").exists()
