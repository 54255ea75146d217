"""Where the EOS id comes from: the argument, the dataset manifest, or a tokenizer directory."""

from __future__ import annotations

import os

from tokenloom.formats import ConfigError
from tokenloom.formats.io import require

__all__ = ["resolve_eos_id", "tokenizer_eos_id"]


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
