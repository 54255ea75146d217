"""The one place eval-broadcast turns texts into ids."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["encode_documents"]


def encode_documents(
    tokenizer: Any, texts: Sequence[str], eos_id: int, *, encoder: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, lengths)``: every text encoded with add_special_tokens=False, then EOS (KempnerForge).

    The same semantics as tokenloom.datasets.HuggingFaceDataset's cache build (a test pins it).
    ``encoder`` is a tokenloom-tokenize ``Encoder`` (``load_encoder``: the fast engine where it is
    proven identical); without one the tokenizer's own ``__call__`` encodes.
    """
    if encoder is not None:
        ids, offsets = encoder.encode_flat(list(texts))
        doc_lengths = np.diff(np.asarray(offsets, dtype=np.int64))
    else:
        encoded = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        doc_lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        ids = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int64, count=int(doc_lengths.sum()))
    lengths = doc_lengths + 1
    tokens = np.empty(int(lengths.sum()), dtype=np.int64)
    # token j of text i lands i slots later than in the flat ids: one EOS per earlier text
    tokens[np.arange(len(ids), dtype=np.int64) + np.repeat(np.arange(len(doc_lengths)), doc_lengths)] = ids
    tokens[np.cumsum(lengths) - 1] = eos_id
    return tokens, lengths
