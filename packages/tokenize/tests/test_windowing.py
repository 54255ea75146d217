"""The exact windowing rule (see tokenloom.tokenize.windowing)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenloom.formats import ConfigError
from tokenloom.tokenize import window_documents

EOD = 0


def entries_of(docs: list[list[int]], max_length: int | None, overlap: int = 0) -> list[tuple[list[int], int]]:
    flat = np.array([t for d in docs for t in d], dtype=np.int64)
    lengths = np.array([len(d) for d in docs], dtype=np.int64)
    entries = window_documents(flat, lengths, eod_id=EOD, max_length=max_length, overlap_size=overlap)
    ends = np.cumsum(entries.lengths)
    starts = ends - entries.lengths
    return [
        (entries.tokens[s:e].tolist(), int(p)) for s, e, p in zip(starts, ends, entries.overlap_prefix, strict=True)
    ]


def reference(docs: list[list[int]], max_length: int | None, overlap: int) -> list[tuple[list[int], int]]:
    """The rule written as plainly as possible."""
    out = []
    for doc in docs:
        if max_length is None or len(doc) <= max_length - 1:
            out.append(([*doc, EOD], 0))
            continue
        content, stride = max_length - 1, max_length - 1 - overlap
        start, k = 0, 0
        while True:
            out.append(([*doc[start : start + content], EOD], overlap if k else 0))
            if start + content >= len(doc):
                break
            start, k = start + stride, k + 1
    return out


DOC = list(range(1, 11))  # 10 tokens, none equal to EOD


def test_document_shorter_than_max_length_is_one_entry() -> None:
    assert entries_of([DOC], max_length=16) == [([*DOC, EOD], 0)]


def test_document_of_max_length_minus_one_fills_exactly_one_entry() -> None:
    assert entries_of([DOC], max_length=11) == [([*DOC, EOD], 0)]


def test_document_of_exactly_max_length_tokens_needs_two_entries() -> None:
    # max_length counts the EOD, so 10 document tokens + EOD do not fit in 10
    assert entries_of([DOC], max_length=10) == [([*DOC[:9], EOD], 0), ([DOC[9], EOD], 0)]


def test_document_of_max_length_plus_one_tokens() -> None:
    doc = list(range(1, 12))  # 11 tokens, max_length 10 -> 9 + 2
    assert entries_of([doc], max_length=10) == [([*doc[:9], EOD], 0), ([*doc[9:], EOD], 0)]


def test_overlap_zero_windows_partition_the_document() -> None:
    doc = list(range(1, 21))
    got = entries_of([doc], max_length=6, overlap=0)
    assert [e for e, _ in got] == [
        [1, 2, 3, 4, 5, 0],
        [6, 7, 8, 9, 10, 0],
        [11, 12, 13, 14, 15, 0],
        [16, 17, 18, 19, 20, 0],
    ]
    assert [p for _, p in got] == [0, 0, 0, 0]


def test_overlap_of_half_max_length_repeats_the_previous_tail() -> None:
    doc = list(range(1, 13))  # 12 tokens, max_length 8: content 7, overlap 4, stride 3
    got = entries_of([doc], max_length=8, overlap=4)
    assert got == [
        ([1, 2, 3, 4, 5, 6, 7, 0], 0),
        ([4, 5, 6, 7, 8, 9, 10, 0], 4),
        ([7, 8, 9, 10, 11, 12, 0], 4),
    ]
    # the prefix of each later window is exactly the previous window's last content tokens
    for (prev, _), (cur, prefix) in itertools.pairwise(got):
        assert cur[:prefix] == prev[:-1][-prefix:]


def test_empty_documents_become_a_lone_eod() -> None:
    assert entries_of([[], DOC[:2], []], max_length=4) == [([EOD], 0), ([1, 2, EOD], 0), ([EOD], 0)]
    assert entries_of([[]], max_length=None) == [([EOD], 0)]


def test_no_max_length_means_no_windowing() -> None:
    doc = list(range(1, 1000))
    assert entries_of([doc, DOC], max_length=None) == [([*doc, EOD], 0), ([*DOC, EOD], 0)]


def test_no_documents_no_entries() -> None:
    assert entries_of([], max_length=8, overlap=2) == []


@pytest.mark.parametrize(
    ("max_length", "overlap"),
    [(1, 0), (0, 0), (8, 5), (8, -1), (3, 2), (2, 1), (None, 1)],
)
def test_invalid_windowing_is_a_config_error(max_length: int | None, overlap: int) -> None:
    with pytest.raises(ConfigError, match="max_length|overlap_size"):
        entries_of([DOC], max_length=max_length, overlap=overlap)


def test_dtype_is_respected() -> None:
    entries = window_documents(np.array([1, 2, 3]), np.array([3]), eod_id=7, max_length=None, dtype=np.uint16)
    assert entries.tokens.dtype == np.uint16
    assert entries.tokens.tolist() == [1, 2, 3, 7]


@settings(max_examples=200, deadline=None)
@given(
    docs=st.lists(st.lists(st.integers(1, 50), max_size=40), max_size=8),
    max_length=st.integers(2, 20),
    data=st.data(),
)
def test_matches_the_plain_reference(docs: list[list[int]], max_length: int, data: st.DataObject) -> None:
    overlap = data.draw(st.integers(0, min(max_length // 2, max_length - 2)))
    got = entries_of(docs, max_length, overlap)
    assert got == reference(docs, max_length, overlap)
    assert all(len(e) <= max_length and e[-1] == EOD for e, _ in got)
