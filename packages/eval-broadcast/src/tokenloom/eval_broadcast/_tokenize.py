"""The one place eval-broadcast turns texts into ids."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from tokenloom.datasets import documents_with_eos

__all__ = ["encode_documents"]


def encode_documents(
    tokenizer: Any, texts: Sequence[str], eos_id: int, *, encoder: Any = None, skip_empty: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, lengths)``: every text encoded with add_special_tokens=False, then EOS (KempnerForge).

    The same semantics as tokenloom.datasets.HuggingFaceDataset's cache build (one function: ``documents_with_eos``).
    ``encoder`` is a tokenloom-tokenize ``Encoder`` (``load_encoder``: the fast engine where it is
    proven identical); without one the tokenizer's own ``__call__`` encodes. ``skip_empty``: texts that encode to no
    tokens are left out (else each is a lone EOS).
    """
    if encoder is not None:
        ids, offsets = encoder.encode_flat(list(texts))
    else:
        encoded = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        offsets = np.concatenate([[0], np.cumsum([len(ids) for ids in encoded], dtype=np.int64)])
        ids = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int64, count=int(offsets[-1]))
    tokens, lengths, _ = documents_with_eos(ids, offsets, eos_id, skip_empty=skip_empty)
    return tokens, lengths
