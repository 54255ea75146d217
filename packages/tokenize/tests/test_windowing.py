"""The exact windowing rule (see tokenloom.tokenize.windowing)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenize_helpers import gpt_reference

from tokenloom.formats import ConfigError
from tokenloom.tokenize import Windowing, window_documents

EOD = 0


def entries_of(docs: list[list[int]], seq_len: int | None, overlap: int = 0) -> list[tuple[list[int], int]]:
    flat = np.array([t for d in docs for t in d], dtype=np.int64)
    lengths = np.array([len(d) for d in docs], dtype=np.int64)
    entries = window_documents(flat, lengths, eod_id=EOD, seq_len=seq_len, overlap_size=overlap)
    ends = np.cumsum(entries.lengths)
    starts = ends - entries.lengths
    return [
        (entries.tokens[s:e].tolist(), int(p)) for s, e, p in zip(starts, ends, entries.overlap_prefix, strict=True)
    ]


def reference(docs: list[list[int]], seq_len: int | None, overlap: int) -> list[tuple[list[int], int]]:
    """The rule written as plainly as possible."""
    out = []
    for doc in docs:
        if seq_len is None or len(doc) <= seq_len - 1:
            out.append(([*doc, EOD], 0))
            continue
        content, stride = seq_len - 1, seq_len - 1 - overlap
        start, k = 0, 0
        while True:
            out.append(([*doc[start : start + content], EOD], overlap if k else 0))
            if start + content >= len(doc):
                break
            start, k = start + stride, k + 1
    return out


DOC = list(range(1, 11))  # 10 tokens, none equal to EOD


def test_document_shorter_than_max_length_is_one_entry() -> None:
    assert entries_of([DOC], seq_len=16) == [([*DOC, EOD], 0)]


def test_document_of_max_length_minus_one_fills_exactly_one_entry() -> None:
    assert entries_of([DOC], seq_len=11) == [([*DOC, EOD], 0)]


def test_document_of_exactly_max_length_tokens_needs_two_entries() -> None:
    # seq_len counts the EOD, so 10 document tokens + EOD do not fit in 10
    assert entries_of([DOC], seq_len=10) == [([*DOC[:9], EOD], 0), ([DOC[9], EOD], 0)]


def test_document_of_max_length_plus_one_tokens() -> None:
    doc = list(range(1, 12))  # 11 tokens, seq_len 10 -> 9 + 2
    assert entries_of([doc], seq_len=10) == [([*doc[:9], EOD], 0), ([*doc[9:], EOD], 0)]


def test_overlap_zero_windows_partition_the_document() -> None:
    doc = list(range(1, 21))
    got = entries_of([doc], seq_len=6, overlap=0)
    assert [e for e, _ in got] == [
        [1, 2, 3, 4, 5, 0],
        [6, 7, 8, 9, 10, 0],
        [11, 12, 13, 14, 15, 0],
        [16, 17, 18, 19, 20, 0],
    ]
    assert [p for _, p in got] == [0, 0, 0, 0]


def test_overlap_of_half_max_length_repeats_the_previous_tail() -> None:
    doc = list(range(1, 13))  # 12 tokens, seq_len 8: content 7, overlap 4, stride 3
    got = entries_of([doc], seq_len=8, overlap=4)
    assert got == [
        ([1, 2, 3, 4, 5, 6, 7, 0], 0),
        ([4, 5, 6, 7, 8, 9, 10, 0], 4),
        ([7, 8, 9, 10, 11, 12, 0], 4),
    ]
    # the prefix of each later window is exactly the previous window's last content tokens
    for (prev, _), (cur, prefix) in itertools.pairwise(got):
        assert cur[:prefix] == prev[:-1][-prefix:]


def test_empty_documents_become_a_lone_eod() -> None:
    assert entries_of([[], DOC[:2], []], seq_len=4) == [([EOD], 0), ([1, 2, EOD], 0), ([EOD], 0)]
    assert entries_of([[]], seq_len=None) == [([EOD], 0)]


def test_no_max_length_means_no_windowing() -> None:
    doc = list(range(1, 1000))
    assert entries_of([doc, DOC], seq_len=None) == [([*doc, EOD], 0), ([*DOC, EOD], 0)]


def test_no_documents_no_entries() -> None:
    assert entries_of([], seq_len=8, overlap=2) == []


@pytest.mark.parametrize(
    ("seq_len", "overlap"),
    [(1, 0), (0, 0), (8, 5), (8, -1), (3, 2), (2, 1), (None, 1)],
)
def test_invalid_windowing_is_a_config_error(seq_len: int | None, overlap: int) -> None:
    with pytest.raises(ConfigError, match="seq_len|overlap_size"):
        entries_of([DOC], seq_len=seq_len, overlap=overlap)


def test_dtype_is_respected() -> None:
    entries = window_documents(np.array([1, 2, 3]), np.array([3]), eod_id=7, seq_len=None, dtype=np.uint16)
    assert entries.tokens.dtype == np.uint16
    assert entries.tokens.tolist() == [1, 2, 3, 7]


#: up to 8 documents of up to 40 ids (no EOD)
DOCS = st.lists(st.lists(st.integers(1, 50), max_size=40), max_size=8)


@settings(max_examples=200, deadline=None)
@given(docs=DOCS, seq_len=st.integers(2, 20), data=st.data())
def test_matches_the_plain_reference(docs: list[list[int]], seq_len: int, data: st.DataObject) -> None:
    overlap = data.draw(st.integers(0, min(seq_len // 2, seq_len - 2)))
    got = entries_of(docs, seq_len, overlap)
    assert got == reference(docs, seq_len, overlap)
    assert all(len(e) <= seq_len and e[-1] == EOD for e, _ in got)


# --- the gpt-simple rule (GPT-Simple's create_windows, deterministic mode) ---


def gpt_entries(docs: list[list[int]], seq_len: int, overlap: int = 0) -> list[tuple[list[int], int]]:
    flat = np.array([t for d in docs for t in d], dtype=np.int64)
    lengths = np.array([len(d) for d in docs], dtype=np.int64)
    entries = window_documents(
        flat, lengths, eod_id=EOD, seq_len=seq_len, overlap_size=overlap, windowing=Windowing.GPT_SIMPLE
    )
    ends = np.cumsum(entries.lengths)
    starts = ends - entries.lengths
    return [
        (entries.tokens[s:e].tolist(), int(p)) for s, e, p in zip(starts, ends, entries.overlap_prefix, strict=True)
    ]


def test_gpt_simple_short_document_is_one_entry_of_up_to_max_length_tokens() -> None:
    assert gpt_entries([[1, 2, 3]], seq_len=4) == [([1, 2, 3, 0], 0)]


def test_gpt_simple_document_of_max_length_tokens_is_one_entry_of_max_length_plus_one() -> None:
    assert gpt_entries([[1, 2, 3, 4]], seq_len=4) == [([1, 2, 3, 4, 0], 0)]


def test_gpt_simple_document_one_longer_ends_only_its_last_window_with_eod() -> None:
    assert gpt_entries([[1, 2, 3, 4, 5]], seq_len=4) == [([1, 2, 3, 4], 0), ([5, 0], 0)]


def test_gpt_simple_emits_redundant_tail_windows_each_with_eod() -> None:
    # seq_len 4, overlap 1: stride 3; the first window already reaches the end of a 4-token document
    assert gpt_entries([[1, 2, 3, 4]], seq_len=4, overlap=1) == [([1, 2, 3, 4, 0], 0), ([4, 0], 1)]
    doc = list(range(1, 11))  # 10 tokens: windows at 0, 3, 6, 9
    assert gpt_entries([doc], seq_len=4, overlap=1) == [
        ([1, 2, 3, 4], 0),
        ([4, 5, 6, 7], 1),
        ([7, 8, 9, 10, 0], 1),
        ([10, 0], 1),
    ]


def test_gpt_simple_stride_is_at_least_half_but_the_recorded_prefix_is_the_overlap() -> None:
    # overlap 3 > seq_len - seq_len // 2: stride max(1, 2) = 2, yet each later window records 3
    assert gpt_entries([[1, 2, 3, 4, 5, 6]], seq_len=4, overlap=3) == [
        ([1, 2, 3, 4], 0),
        ([3, 4, 5, 6, 0], 3),
        ([5, 6, 0], 2),  # min(overlap, the window's document tokens)
    ]


def test_gpt_simple_overlap_above_max_length_masks_whole_windows() -> None:
    assert gpt_entries([[1, 2, 3, 4, 5]], seq_len=4, overlap=5) == [
        ([1, 2, 3, 4], 0),
        ([3, 4, 5, 0], 3),
        ([5, 0], 1),
    ]


def test_gpt_simple_drops_documents_of_no_tokens() -> None:
    flat = np.array([1, 2], dtype=np.int64)
    entries = window_documents(flat, np.array([0, 2, 0]), eod_id=EOD, seq_len=4, windowing=Windowing.GPT_SIMPLE)
    assert entries.tokens.tolist() == [1, 2, EOD] and entries.lengths.tolist() == [3]
    assert entries.documents_without_entries == 2 and entries.truncated_documents == 0


def test_gpt_simple_max_length_one() -> None:
    assert gpt_entries([[1, 2]], seq_len=1) == [([1], 0), ([2, 0], 0)]


def test_gpt_simple_stops_a_document_at_10001_windows() -> None:
    doc = np.arange(1, 20_005, dtype=np.int64)  # 20,004 tokens, stride 2: 10,002 windows needed
    entries = window_documents(doc, np.array([len(doc)]), eod_id=EOD, seq_len=2, windowing="gpt-simple")
    assert len(entries) == 10_001 and entries.truncated_documents == 1
    assert entries.lengths.tolist() == [2] * 10_001  # no window reached the end: no EOD anywhere
    assert entries.tokens.tolist() == list(range(1, 20_003))


@pytest.mark.parametrize(
    ("seq_len", "overlap", "match"),
    [
        (None, 0, "needs seq_len"),
        (0, 0, "seq_len"),
        (8, -1, "skip tokens"),
        (1, 1, "stride of 0"),
        (70_000, 65_536, "wrap"),
    ],
)
def test_gpt_simple_refuses_what_it_cannot_reproduce(seq_len: int | None, overlap: int, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        window_documents(
            np.array([1]),
            np.array([1]),
            eod_id=EOD,
            seq_len=seq_len,
            overlap_size=overlap,
            windowing=Windowing.GPT_SIMPLE,
        )


def test_unknown_windowing_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="expected one of"):
        window_documents(np.array([1]), np.array([1]), eod_id=EOD, seq_len=4, windowing="megatron")


@settings(max_examples=300, deadline=None)
@given(docs=DOCS, seq_len=st.integers(1, 20), data=st.data())
def test_gpt_simple_matches_the_plain_reference(docs: list[list[int]], seq_len: int, data: st.DataObject) -> None:
    overlap = data.draw(st.integers(0, 25) if seq_len > 1 else st.just(0))
    assert gpt_entries(docs, seq_len, overlap) == gpt_reference(docs, seq_len, overlap)
