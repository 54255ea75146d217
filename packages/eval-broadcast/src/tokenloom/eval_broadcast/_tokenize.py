"""The one place eval-broadcast turns texts into ids (swap in a faster engine here)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["encode_documents"]


def encode_documents(tokenizer: Any, texts: Sequence[str], eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, lengths)``: every text encoded with add_special_tokens=False, then EOS (KempnerForge).

    The same semantics as tokenloom.datasets.HuggingFaceDataset's cache build (a test pins it).
    """
    encoded = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    lengths = np.fromiter((len(ids) + 1 for ids in encoded), dtype=np.int64, count=len(encoded))
    tokens = np.empty(int(lengths.sum()), dtype=np.int64)
    ends = np.cumsum(lengths)
    for ids, end, length in zip(encoded, ends.tolist(), lengths.tolist(), strict=True):
        tokens[end - length : end - 1] = ids
    tokens[ends - 1] = eos_id
    return tokens, lengths
