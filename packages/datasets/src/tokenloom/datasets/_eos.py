"""Where the EOS id comes from (the argument, the dataset manifest, or a tokenizer directory), and where it goes:
after every encoded text (KempnerForge's stream, the one both tokenized caches and eval sets build)."""

from __future__ import annotations

import os

import numpy as np

from tokenloom.formats import ConfigError
from tokenloom.formats.io import require

__all__ = ["documents_with_eos", "resolve_eos_id", "tokenizer_eos_id"]


def documents_with_eos(
    ids: np.ndarray, offsets: np.ndarray, eos_id: int, *, skip_empty: bool = False
) -> tuple[np.ndarray, np.ndarray, int]:
    """Flat ids + offsets of encoded texts -> ``(tokens, lengths, skipped)``: every text followed by ``eos_id``
    (int64), the entry lengths, and how many texts that encoded to no tokens were left out (``skip_empty``;
    otherwise each is a lone EOS)."""
    doc_lengths = np.diff(np.asarray(offsets, dtype=np.int64))
    skipped = 0
    if skip_empty:
        skipped = int((doc_lengths == 0).sum())
        doc_lengths = doc_lengths[doc_lengths > 0]
    lengths = doc_lengths + 1
    tokens = np.empty(int(lengths.sum()), dtype=np.int64)
    # token j of text i lands i slots later than in the flat ids: one EOS per earlier text
    tokens[np.arange(len(ids), dtype=np.int64) + np.repeat(np.arange(len(doc_lengths)), doc_lengths)] = ids
    tokens[np.cumsum(lengths) - 1] = eos_id
    return tokens, lengths, skipped


def tokenizer_eos_id(tokenizer_path: str | os.PathLike[str]) -> int:
    """The EOS id of a saved Hugging Face tokenizer (local directory), or ConfigError."""
    transformers = require(
        "transformers", distribution="tokenloom-datasets", extra="hf", purpose="Reading the EOS id from a tokenizer"
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(os.fspath(tokenizer_path))
    if tokenizer.eos_token_id is None:
        raise ConfigError(
            "the tokenizer defines no EOS token",
            path=tokenizer_path,
            field="eos_token",
            hint="Pass eos_id=... explicitly",
        )
    return int(tokenizer.eos_token_id)


def resolve_eos_id(
    eos_id: int | None,
    dataset_eos_id: int | None,
    tokenizer_path: str | os.PathLike[str] | None,
    *,
    path: str | os.PathLike[str] | None = None,
) -> int:
    """First of: ``eos_id``, the dataset's recorded EOS id, the tokenizer's; none is a ConfigError."""
    if eos_id is not None:
        if eos_id < 0:
            raise ConfigError(f"eos_id is {eos_id}, expected >= 0", field="eos_id")
        if dataset_eos_id is not None and dataset_eos_id != eos_id:
            raise ConfigError(
                f"eos_id {eos_id} was given but the dataset records {dataset_eos_id}",
                path=path,
                field="eos_id",
                hint="Drop eos_id=... to use the dataset's, or fix the data",
            )
        return eos_id
    if dataset_eos_id is not None:
        return dataset_eos_id
    if tokenizer_path is not None:
        return tokenizer_eos_id(tokenizer_path)
    raise ConfigError(
        "document packing needs an EOS id: none was given, the dataset records none and no tokenizer_path was set",
        path=path,
        field="eos_id",
        hint="Pass eos_id=... or tokenizer_path=...",
    )
