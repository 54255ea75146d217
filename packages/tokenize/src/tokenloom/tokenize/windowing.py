"""Documents -> entries, vectorised: tokenloom's rule (the default) or GPT-Simple's, exactly.

Two rules, chosen by :class:`Windowing` (``tokenloom tokenize --windowing``):

``tokenloom`` (default; pinned by ``tests/test_windowing.py``):

- A document of ``n`` tokens becomes entries of at most ``seq_len`` tokens
  each, *including* the EOD token that ends every entry. So each entry carries
  up to ``seq_len - 1`` document tokens (its *content*).
- If ``n <= seq_len - 1`` the document is one entry: its tokens + EOD, with
  overlap prefix 0. An empty document is one entry ``[EOD]``.
- Otherwise windows of content length ``C = seq_len - 1`` start at
  ``0, S, 2S, ...`` with stride ``S = C - overlap_size``, until a window reaches
  the document's end. Window ``k > 0`` repeats the last ``overlap_size`` content
  tokens of window ``k - 1``; its overlap prefix is ``overlap_size`` (the loss
  masks those tokens). Only the last window can be shorter than ``C``.
- ``seq_len=None`` disables windowing: every document is one entry.
- ``overlap_size <= seq_len / 2`` with a stride of at least one token.

``gpt-simple``: GPT-Simple's ``create_windows`` (``gpt_simple/pretokenize.py``,
gpt-simple-lm 0.1.2) in its deterministic mode (no ``--probabilistic_overlap``),
reproduced token for token (pinned here by hand-computed cases and in
``integration-tests`` against GPT-Simple's own pretokenize):

- A document of no tokens gives no entry.
- If ``n < seq_len`` the document is one entry: its tokens + EOD, prefix 0
  (so up to ``seq_len`` tokens with the EOD).
- Otherwise the stride is ``S = max(seq_len - overlap_size, seq_len // 2)``
  and a window of ``min(seq_len, n - kS)`` document tokens starts at every
  ``kS < n``: ``ceil(n / S)`` windows, but at most 10,001 (GPT-Simple stops
  there, logging a warning; the document's remaining tokens are dropped).
- Every window that reaches the document's end (``kS + seq_len >= n``) gets
  an EOD, so last windows hold up to ``seq_len + 1`` tokens, and when
  ``S < seq_len`` the windows after the first such one repeat the tail
  ("redundant tail windows"), each again with an EOD.
- Window ``k > 0`` records an overlap prefix of ``min(overlap_size, its document
  tokens)`` when ``overlap_size > 0``; this is ``overlap_size`` even where the
  stride was raised to ``seq_len // 2`` and fewer tokens actually repeat.
- ``seq_len`` is required; ``0 <= overlap_size <= 65535`` (GPT-Simple would
  wrap larger prefixes modulo 65,536 in its uint16 index).
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from enum import StrEnum
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from tokenloom.formats import ConfigError

__all__ = [
    "GPT_SIMPLE_MAX_WINDOWS",
    "MAX_OVERLAP",
    "Entries",
    "Windowing",
    "member",
    "validate_window",
    "window_documents",
]

#: The overlap prefix is stored as uint16 per entry.
MAX_OVERLAP = 65535
#: GPT-Simple's create_windows stops a document after this many windows.
GPT_SIMPLE_MAX_WINDOWS = 10_001
_E = TypeVar("_E", bound=StrEnum)


class Windowing(StrEnum):
    """Which rule turns a document into entries (see the module docstring)."""

    TOKENLOOM = "tokenloom"
    """EOD in every window, seq_len counts the EOD, no redundant tail windows; empty documents kept."""
    GPT_SIMPLE = "gpt-simple"
    """GPT-Simple's pretokenize exactly (deterministic mode): EOD only where a window reaches the end."""


def member(choices: type[_E], value: object, name: str) -> _E:
    """``value`` as a member of ``choices`` (a StrEnum), or a ConfigError naming the field and listing them."""
    try:
        return choices(value)
    except ValueError:
        raise ConfigError(f"{name} is {value!r}, expected one of {[c.value for c in choices]}", field=name) from None


def validate_window(seq_len: int | None, overlap_size: int, windowing: Windowing | str = Windowing.TOKENLOOM) -> None:
    """Raise ConfigError unless (seq_len, overlap_size) is a valid windowing under ``windowing``."""
    if member(Windowing, windowing, "windowing") is Windowing.GPT_SIMPLE:
        _validate_gpt_simple(seq_len, overlap_size)
        return
    if seq_len is None:
        if overlap_size != 0:
            raise ConfigError(
                f"overlap_size is {overlap_size} but seq_len is not set",
                field="overlap_size",
                hint="Pass --seq-len N together with --overlap-size, or drop --overlap-size",
            )
        return
    if seq_len < 2:
        raise ConfigError(
            f"seq_len is {seq_len}, expected >= 2 (at least one document token plus EOD)",
            field="seq_len",
        )
    if overlap_size < 0 or 2 * overlap_size > seq_len or overlap_size > seq_len - 2:
        raise ConfigError(
            f"overlap_size is {overlap_size}, expected 0 <= overlap_size <= seq_len / 2 "
            f"(seq_len is {seq_len}) with each window advancing by at least one token",
            field="overlap_size",
            hint=f"Pass --overlap-size between 0 and {min(seq_len // 2, seq_len - 2)}",
        )
    if overlap_size > MAX_OVERLAP:
        raise ConfigError(
            f"overlap_size is {overlap_size}, the overlap prefix is stored as uint16 (<= {MAX_OVERLAP})",
            field="overlap_size",
        )


def _validate_gpt_simple(seq_len: int | None, overlap_size: int) -> None:
    if seq_len is None:
        raise ConfigError(
            "windowing 'gpt-simple' needs seq_len: GPT-Simple's pretokenize always windows "
            "(its --max_length defaults to 3072)",
            field="seq_len",
            hint="Pass --seq-len with the --max_length of the GPT-Simple run to reproduce "
            "(3072 if it used the default)",
        )
    if seq_len < 1:
        raise ConfigError(f"seq_len is {seq_len}, expected >= 1", field="seq_len")
    if overlap_size < 0:
        raise ConfigError(
            f"overlap_size is {overlap_size}: GPT-Simple would skip tokens between windows; "
            "tokenloom does not reproduce that",
            field="overlap_size",
            hint="Pass --overlap-size >= 0",
        )
    if overlap_size > MAX_OVERLAP:
        raise ConfigError(
            f"overlap_size is {overlap_size}: GPT-Simple would wrap overlap prefixes above {MAX_OVERLAP} "
            "modulo 65,536 in its uint16 index; tokenloom does not reproduce that",
            field="overlap_size",
            hint=f"Pass --overlap-size <= {MAX_OVERLAP}",
        )
    if max(seq_len - overlap_size, seq_len // 2) < 1:
        raise ConfigError(
            f"seq_len {seq_len} with overlap_size {overlap_size} gives GPT-Simple a stride of 0 "
            "(it would emit 10,001 copies of each document's first window)",
            field="overlap_size",
            hint="Pass --overlap-size 0 with --seq-len 1, or a larger --seq-len",
        )


@dataclass(eq=False, slots=True)
class Entries:
    """Entries in order: a flat token array, each entry's length and overlap prefix.

    ``documents_without_entries`` and ``truncated_documents`` count what the
    gpt-simple rule drops (documents of no tokens; documents cut at 10,001 windows).
    """

    tokens: npt.NDArray[np.integer]
    lengths: npt.NDArray[np.int64]
    overlap_prefix: npt.NDArray[np.uint16]
    _: KW_ONLY
    documents_without_entries: int = 0
    truncated_documents: int = 0

    def __len__(self) -> int:
        return len(self.lengths)


@dataclass(eq=False, slots=True)
class _Plan:
    """Per entry: content start in the flat document tokens, content length, overlap prefix, EOD or not."""

    starts: npt.NDArray[np.int64]
    lengths: npt.NDArray[np.int64]
    prefix: npt.NDArray[np.uint16]
    has_eod: npt.NDArray[np.bool_] | None = None
    _: KW_ONLY
    dropped: int = 0
    truncated: int = 0

    def __post_init__(self) -> None:
        if self.has_eod is None:
            self.has_eod = np.ones(len(self.lengths), dtype=bool)


def _doc_starts(doc_lengths: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    doc_starts = np.zeros(len(doc_lengths), dtype=np.int64)
    np.cumsum(doc_lengths[:-1], out=doc_starts[1:])
    return doc_starts


def _expand(
    windows: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(document of each entry, index k of the entry within its document) for per-document window counts."""
    doc_of_entry = np.repeat(np.arange(len(windows)), windows)
    first_entry = np.zeros(len(windows), dtype=np.int64)
    np.cumsum(windows[:-1], out=first_entry[1:])
    k = np.arange(len(doc_of_entry), dtype=np.int64) - np.repeat(first_entry, windows)
    return doc_of_entry, k


def _window_plan(doc_lengths: npt.NDArray[np.int64], seq_len: int | None, overlap_size: int) -> _Plan:
    """tokenloom's rule."""
    doc_starts = _doc_starts(doc_lengths)
    if seq_len is None:
        return _Plan(doc_starts, doc_lengths.astype(np.int64), np.zeros(len(doc_lengths), dtype=np.uint16))
    content = seq_len - 1
    stride = content - overlap_size
    # windows per document: 1 if it fits, else 1 + ceil((n - C) / S)
    extra = np.maximum(doc_lengths - content, 0)
    windows = 1 + (extra + stride - 1) // stride
    doc_of_entry, k = _expand(windows)
    start_in_doc = k * stride
    length = np.minimum(content, doc_lengths[doc_of_entry] - start_in_doc)
    prefix = np.where(k > 0, overlap_size, 0).astype(np.uint16)
    return _Plan(doc_starts[doc_of_entry] + start_in_doc, length.astype(np.int64), prefix)


def _gpt_simple_plan(doc_lengths: npt.NDArray[np.int64], seq_len: int, overlap_size: int) -> _Plan:
    """GPT-Simple's create_windows, deterministic mode (see the module docstring)."""
    doc_starts = _doc_starts(doc_lengths)
    stride = max(seq_len - overlap_size, seq_len // 2)
    natural = np.where(doc_lengths < seq_len, 1, -(-doc_lengths // stride))
    natural = np.where(doc_lengths == 0, 0, natural)
    windows = np.minimum(natural, GPT_SIMPLE_MAX_WINDOWS)
    doc_of_entry, k = _expand(windows)
    n = doc_lengths[doc_of_entry]
    short = n < seq_len
    start_in_doc = np.where(short, 0, k * stride)
    length = np.where(short, n, np.minimum(seq_len, n - start_in_doc))
    has_eod = short | (start_in_doc + seq_len >= n)
    prefix = np.where((k > 0) & (overlap_size > 0), np.minimum(overlap_size, length), 0).astype(np.uint16)
    return _Plan(
        doc_starts[doc_of_entry] + start_in_doc,
        length.astype(np.int64),
        prefix,
        has_eod,
        dropped=int(np.count_nonzero(doc_lengths == 0)),
        truncated=int(np.count_nonzero(natural > GPT_SIMPLE_MAX_WINDOWS)),
    )


def _whole_documents(
    doc_tokens: npt.NDArray[np.integer], doc_lengths: npt.NDArray[np.int64], eod_id: int, dtype: np.dtype
) -> Entries:
    """Every document is one entry (it fits): its tokens then EOD, the rule's plan without its gather index.

    Why a path of its own: the general plan builds an int64 index per token (about a third of a
    worker's time on the fast engine); here the tokens are copied once, in order.
    """
    entry_lengths = doc_lengths + 1
    eod_positions = np.cumsum(entry_lengths) - 1
    out = np.empty(int(entry_lengths.sum()), dtype=dtype)
    content = np.ones(len(out), dtype=bool)
    content[eod_positions] = False
    out[content] = doc_tokens
    out[eod_positions] = eod_id
    return Entries(out, entry_lengths, np.zeros(len(doc_lengths), dtype=np.uint16))


def window_documents(
    doc_tokens: npt.NDArray[np.integer],
    doc_lengths: npt.NDArray[np.int64],
    *,
    eod_id: int,
    seq_len: int | None,
    overlap_size: int = 0,
    dtype: npt.DTypeLike = np.uint32,
    windowing: Windowing | str = Windowing.TOKENLOOM,
) -> Entries:
    """Split concatenated documents into entries under ``windowing`` (see the module docstring)."""
    rule = member(Windowing, windowing, "windowing")
    validate_window(seq_len, overlap_size, rule)
    doc_lengths = np.asarray(doc_lengths, dtype=np.int64)
    if rule is Windowing.TOKENLOOM and (seq_len is None or not len(doc_lengths) or doc_lengths.max() < seq_len):
        return _whole_documents(doc_tokens, doc_lengths, eod_id, np.dtype(dtype))
    if rule is Windowing.GPT_SIMPLE and seq_len is not None:  # validated: never None here
        plan = _gpt_simple_plan(doc_lengths, seq_len, overlap_size)
    else:
        plan = _window_plan(doc_lengths, seq_len, overlap_size)
    lengths, has_eod = plan.lengths, plan.has_eod
    if has_eod is None:  # __post_init__ fills it: never None here
        raise TypeError("a window plan without has_eod")
    eods = has_eod.astype(np.int64)
    entry_lengths = lengths + eods
    total = int(entry_lengths.sum())
    out = np.empty(total, dtype=dtype)
    ends = np.cumsum(entry_lengths)
    eod_positions = (ends - 1)[has_eod]
    content_mask = np.ones(total, dtype=bool)
    content_mask[eod_positions] = False
    # gather index of each content token: its entry's start + its rank within the entry
    content_total = int(lengths.sum())
    if content_total:
        offsets = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1], out=offsets[1:])
        gather = np.arange(content_total, dtype=np.int64) + np.repeat(plan.starts - offsets, lengths)
        out[content_mask] = doc_tokens[gather]
    out[eod_positions] = eod_id
    return Entries(
        out,
        entry_lengths.astype(np.int64),
        plan.prefix,
        documents_without_entries=plan.dropped,
        truncated_documents=plan.truncated,
    )
