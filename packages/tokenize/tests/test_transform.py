"""The record transform seam: transform_for chooses the run's transform by its kind (text documents, chat records)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from tokenloom.tokenize._config import TokenizeConfig
from tokenloom.tokenize._executor import start_encoding
from tokenloom.tokenize._transform import TextTransform, transform_for
from tokenloom.tokenize._worker import encode_chunk
from tokenloom.tokenize.inputs import discover_inputs, read_chunks


def test_a_text_run_names_its_transform_and_it_encodes_as_the_worker_does(
    tiny_tokenizer: Path, jsonl_dir: Callable[..., Path]
) -> None:
    corpus = jsonl_dir({"a.jsonl": [{"text": t} for t in ["alpha beta", "", "gamma", "delta epsilon"] * 5]})
    config = TokenizeConfig(input_dir=corpus, output_dir=corpus.parent / "out", tokenizer=str(tiny_tokenizer))
    files = discover_inputs(corpus)

    def chunks():
        return read_chunks(files, chunk_lines=3, chunk_bytes=1 << 20, max_line_bytes=1 << 20)

    for workers in (0, 2):
        options = dataclasses.replace(config.encode_options(), num_workers=workers)
        with start_encoding(str(tiny_tokenizer), files, options) as encoding:
            encoding.engine  # noqa: B018  (the probe's choice, before the settings are read)
            text = transform_for(encoding.settings, str(tiny_tokenizer), encoding)
            assert isinstance(text, TextTransform)
            got = [r.tokens.tolist() for r in text.encode(chunks())]
            alone = transform_for(encoding.settings, str(tiny_tokenizer))  # a unit task: this thread
            assert [r.tokens.tolist() for r in alone.encode(chunks())] == got
            assert got == [encode_chunk(c, encoding.settings).tokens.tolist() for c in chunks()]
