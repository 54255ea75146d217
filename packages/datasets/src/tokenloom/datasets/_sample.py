"""Tokens -> the sample dict: the one implementation every tokenloom dataset reuses.

A *window* holds L + 1 tokens; the sample is ``input_ids = window[:-1]`` and
``labels = window[1:]`` with ignored labels set to -100. Everything is
vectorised over a 2-D batch of windows (``build_batch``); ``build_sample`` is
the one-window view of it. Both return int64 numpy arrays (``cu_seqlens``
int32); :func:`to_torch` turns a sample into tensors without copying.

Document boundaries come either from the EOS id (a running counter that
increments *after* each EOS, so a document includes its trailing EOS) or from
explicit per-token document ids (bin-packed sequences).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike

from tokenloom.datasets._packing_mode import Packing, as_packing
from tokenloom.formats import ConfigError

__all__ = ["IGNORE_INDEX", "Packing", "build_batch", "build_sample", "to_torch"]

IGNORE_INDEX = -100


def build_batch(
    windows: ArrayLike,
    *,
    eos_id: int | None = None,
    packing: Packing | str | bool = Packing.NONE,
    doc_ids: ArrayLike | None = None,
    label_ignore: ArrayLike | None = None,
    position_ids: bool = False,
    cu_seqlens: bool = False,
) -> dict[str, np.ndarray]:
    """Samples from a ``(B, L + 1)`` array of windows.

    Args:
        windows: token ids, one window of L + 1 tokens per row.
        eos_id: the end-of-document token; needed for document packing without ``doc_ids``.
        packing: see :class:`Packing` (``True`` = documents).
        doc_ids: ``(B, L + 1)`` document index of every window token; replaces EOS detection
            (bin-packed sequences: padding is its own document).
        label_ignore: ``(B, L + 1)`` bool, True where a token must never be a label
            (overlap prefixes, padding).
        position_ids: emit ``position_ids`` reset at each document start (DOCUMENTS packing).
        cu_seqlens: emit ``cu_seqlens``: int32 document boundaries ``[0, ..., L]`` padded
            with L to length L + 1 so that batches collate.

    Returns:
        ``input_ids`` and ``labels`` (int64, ``(B, L)``), plus ``doc_ids`` and, as asked,
        ``position_ids`` (int64) and ``cu_seqlens`` (int32, ``(B, L + 1)``).
    """
    mode = as_packing(packing)
    windows = np.asarray(windows)
    if windows.ndim != 2 or windows.shape[1] < 2:
        raise ConfigError(f"windows have shape {windows.shape}, expected (batch, L + 1) with L >= 1", field="windows")
    tokens = windows.astype(np.int64, copy=False)
    length = tokens.shape[1] - 1
    input_ids = tokens[:, :-1]
    labels = tokens[:, 1:].copy()
    sample: dict[str, np.ndarray] = {"input_ids": input_ids, "labels": labels}
    if label_ignore is not None:
        labels[np.asarray(label_ignore, dtype=bool)[:, 1:]] = IGNORE_INDEX

    if mode is Packing.NONE and doc_ids is None:
        if position_ids or cu_seqlens:
            raise ConfigError(
                "position_ids / cu_seqlens need document boundaries", field="pack_sequences", hint="Set pack_sequences"
            )
        return sample

    if doc_ids is None:
        if eos_id is None:
            raise ConfigError("document packing needs an EOS id, none was given", field="eos_id")
        is_eos = tokens == eos_id
        full_doc = np.zeros_like(tokens)
        np.cumsum(is_eos[:, :-1], axis=1, out=full_doc[:, 1:])
    else:
        full_doc = np.asarray(doc_ids, dtype=np.int64)
        if full_doc.shape != tokens.shape:
            raise ConfigError(f"doc_ids have shape {full_doc.shape}, expected {tokens.shape}", field="doc_ids")
    crossing = full_doc[:, :-1] != full_doc[:, 1:]
    labels[crossing] = IGNORE_INDEX
    input_doc = full_doc[:, :-1]
    sample["doc_ids"] = input_doc - input_doc[:, :1]  # documents numbered from 0 in every sample

    columns = np.arange(length, dtype=np.int64)
    starts = np.ones_like(input_doc, dtype=bool)
    starts[:, 1:] = input_doc[:, 1:] != input_doc[:, :-1]
    if mode is Packing.GPT_SIMPLE:
        sample["position_ids"] = np.broadcast_to(columns, input_doc.shape).copy()
    elif position_ids:
        start_of_doc = np.maximum.accumulate(np.where(starts, columns, 0), axis=1)
        sample["position_ids"] = columns - start_of_doc
    if cu_seqlens:
        boundaries = np.sort(np.where(starts, columns, length), axis=1)
        cu = np.empty((tokens.shape[0], length + 1), dtype=np.int32)
        cu[:, :-1] = boundaries
        cu[:, -1] = length
        sample["cu_seqlens"] = cu
    return sample


def build_sample(window: ArrayLike, **options: Any) -> dict[str, np.ndarray]:
    """One sample from one window of L + 1 tokens; options as for :func:`build_batch`."""
    window = np.asarray(window)
    if window.ndim != 1:
        raise ConfigError(f"window has shape {window.shape}, expected 1-D", field="window")
    for key in ("doc_ids", "label_ignore"):
        if options.get(key) is not None:
            options[key] = np.asarray(options[key])[None, :]
    batch = build_batch(window[None, :], **options)
    return {key: value[0] for key, value in batch.items()}


def to_torch(sample: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """The same dict with zero-copy torch tensors."""
    return {key: torch.from_numpy(np.ascontiguousarray(value)) for key, value in sample.items()}
