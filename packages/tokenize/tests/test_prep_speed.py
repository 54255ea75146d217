"""The costs removed for #24's speed item keep the output: whole-document windowing, the probe in a worker."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenloom.formats import open_dataset
from tokenloom.tokenize import TokenizeConfig, default_tokenizer_path, tokenize
from tokenloom.tokenize._executor import PROBE_INPUT_CHARS
from tokenloom.tokenize.windowing import _window_plan, window_documents


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=30), st.sampled_from([None, 41, 64]))
def test_whole_documents_are_what_the_general_plan_gives(lengths: list[int], max_length: int | None) -> None:
    doc_lengths = np.array(lengths, dtype=np.int64)
    tokens = (np.arange(int(doc_lengths.sum()), dtype=np.uint32) * 7919) % 60000
    entries = window_documents(tokens, doc_lengths, eod_id=5, seq_len=max_length, dtype=np.uint16)
    plan = _window_plan(doc_lengths, max_length, 0)  # the general rule's plan: one entry per document here
    expected: list[int] = []
    for start, length in zip(plan.starts.tolist(), plan.lengths.tolist(), strict=True):
        expected += [*tokens[start : start + length].tolist(), 5]
    assert entries.tokens.dtype == np.uint16 and entries.tokens.tolist() == expected
    assert entries.lengths.tolist() == (plan.lengths + 1).tolist()
    assert not entries.overlap_prefix.any()


def test_the_engine_probe_in_a_worker_chooses_and_records_as_in_process(
    tmp_path: Path, jsonl_dir: Callable[..., Path], make_texts: Callable[..., list[str]], tree_digest
) -> None:
    big = "a long document " * (PROBE_INPUT_CHARS // 8)  # longer than the probe's budget: cut to fit, not skipped
    corpus = jsonl_dir({"a.jsonl": [{"text": t} for t in [big, *make_texts(300, seed=8)]]})
    records = {}
    for workers in (0, 2):
        out = tmp_path / f"w{workers}"
        config = TokenizeConfig(input_dir=corpus, output_dir=out, tokenizer=str(default_tokenizer_path()),
                                num_workers=workers)  # fmt: skip
        summary = tokenize(config)
        assert summary.engine == "fast" and "(1 from the input)" in summary.engine_reason  # its prefix, then the cap
        records[workers] = (
            open_dataset(out).metadata["tokenize"]["engine"],
            tree_digest(out).get("unit_000000_0000.bin"),
        )
    assert records[0] == records[2]
