"""Documents -> entries: tokenloom's windowing (EOD in every window) with an overlap prefix, vectorised.

This is tokenloom's rule, not GPT-Simple's (``gpt_simple/pretokenize.py``,
``create_windows``), on purpose: GPT-Simple ends only a document's last window
with EOD, does not count the EOD in ``max_length`` (its last windows can hold
``max_length + 1`` tokens, whose EOD its packer then cuts), and keeps emitting
windows after one has reached the document's end (redundant tail windows). Its
own pretokenize output opens in tokenloom as it is.

The exact rule (pinned by the tests):

- A document of ``n`` tokens becomes entries of at most ``max_length`` tokens
  each, *including* the EOD token that ends every entry. So each entry carries
  up to ``max_length - 1`` document tokens (its *content*).
- If ``n <= max_length - 1`` the document is one entry: its tokens + EOD, with
  overlap prefix 0. An empty document is one entry ``[EOD]``.
- Otherwise windows of content length ``C = max_length - 1`` start at
  ``0, S, 2S, ...`` with stride ``S = C - overlap_size``, until a window reaches
  the document's end. Window ``k > 0`` repeats the last ``overlap_size`` content
  tokens of window ``k - 1``; its overlap prefix is ``overlap_size`` (the loss
  masks those tokens). Only the last window can be shorter than ``C``.
- ``max_length=None`` disables windowing: every document is one entry.

``overlap_size <= max_length / 2`` (and a stride of at least one token) is
validated by :func:`validate_window`.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tokenloom.formats import ConfigError

__all__ = ["MAX_OVERLAP", "Entries", "validate_window", "window_documents"]

#: The overlap prefix is stored as uint16 per entry.
MAX_OVERLAP = 65535


def validate_window(max_length: int | None, overlap_size: int) -> None:
    """Raise ConfigError unless (max_length, overlap_size) is a valid windowing."""
    if max_length is None:
        if overlap_size != 0:
            raise ConfigError(
                f"overlap_size is {overlap_size} but max_length is not set",
                field="overlap_size",
                hint="Pass --max-length N together with --overlap-size, or drop --overlap-size",
            )
        return
    if max_length < 2:
        raise ConfigError(
            f"max_length is {max_length}, expected >= 2 (at least one document token plus EOD)",
            field="max_length",
        )
    if overlap_size < 0 or 2 * overlap_size > max_length or overlap_size > max_length - 2:
        raise ConfigError(
            f"overlap_size is {overlap_size}, expected 0 <= overlap_size <= max_length / 2 "
            f"(max_length is {max_length}) with each window advancing by at least one token",
            field="overlap_size",
            hint=f"Pass --overlap-size between 0 and {min(max_length // 2, max_length - 2)}",
        )
    if overlap_size > MAX_OVERLAP:
        raise ConfigError(
            f"overlap_size is {overlap_size}, the overlap prefix is stored as uint16 (<= {MAX_OVERLAP})",
            field="overlap_size",
        )


class Entries:
    """Entries in order: a flat token array, each entry's length and overlap prefix."""

    __slots__ = ("lengths", "overlap_prefix", "tokens")

    def __init__(
        self,
        tokens: npt.NDArray[np.integer],
        lengths: npt.NDArray[np.int64],
        overlap_prefix: npt.NDArray[np.uint16],
    ) -> None:
        self.tokens = tokens
        self.lengths = lengths
        self.overlap_prefix = overlap_prefix

    def __len__(self) -> int:
        return len(self.lengths)


def _window_plan(
    doc_lengths: npt.NDArray[np.int64], max_length: int | None, overlap_size: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.uint16]]:
    """(content start in the flat doc tokens, content length, overlap prefix) per entry."""
    doc_starts = np.zeros(len(doc_lengths), dtype=np.int64)
    np.cumsum(doc_lengths[:-1], out=doc_starts[1:])
    if max_length is None:
        return doc_starts, doc_lengths.astype(np.int64), np.zeros(len(doc_lengths), dtype=np.uint16)
    content = max_length - 1
    stride = content - overlap_size
    # windows per document: 1 if it fits, else 1 + ceil((n - C) / S)
    extra = np.maximum(doc_lengths - content, 0)
    windows = 1 + (extra + stride - 1) // stride
    doc_of_entry = np.repeat(np.arange(len(doc_lengths)), windows)
    first_entry = np.zeros(len(doc_lengths), dtype=np.int64)
    np.cumsum(windows[:-1], out=first_entry[1:])
    k = np.arange(len(doc_of_entry), dtype=np.int64) - np.repeat(first_entry, windows)
    start_in_doc = k * stride
    length = np.minimum(content, doc_lengths[doc_of_entry] - start_in_doc)
    prefix = np.where(k > 0, overlap_size, 0).astype(np.uint16)
    return doc_starts[doc_of_entry] + start_in_doc, length.astype(np.int64), prefix


def window_documents(
    doc_tokens: npt.NDArray[np.integer],
    doc_lengths: npt.NDArray[np.int64],
    *,
    eod_id: int,
    max_length: int | None,
    overlap_size: int = 0,
    dtype: npt.DTypeLike = np.uint32,
) -> Entries:
    """Split concatenated documents into EOD-terminated entries (see the module docstring)."""
    validate_window(max_length, overlap_size)
    starts, lengths, prefix = _window_plan(np.asarray(doc_lengths, dtype=np.int64), max_length, overlap_size)
    entry_lengths = lengths + 1
    total = int(entry_lengths.sum())
    out = np.empty(total, dtype=dtype)
    ends = np.cumsum(entry_lengths)
    eod_positions = ends - 1
    content_mask = np.ones(total, dtype=bool)
    content_mask[eod_positions] = False
    # gather index of each content token: its entry's start + its rank within the entry
    content_total = int(lengths.sum())
    if content_total:
        offsets = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1], out=offsets[1:])
        gather = np.arange(content_total, dtype=np.int64) + np.repeat(starts - offsets, lengths)
        out[content_mask] = doc_tokens[gather]
    out[eod_positions] = eod_id
    return Entries(out, entry_lengths.astype(np.int64), prefix)
