"""Loading a Hugging Face tokenizer lazily, its fingerprint, and batch encoding.

The parent process never builds a tokenizer: a tokenizer used before a fork
can deadlock the children (the `tokenizers` fork issue). Workers call
:func:`load` on first use; :func:`describe` runs in a worker and sends back only
plain values (EOS id, vocab size).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from tokenloom.formats import ConfigError

__all__ = [
    "DEFAULT_TOKENIZER",
    "LoadedTokenizer",
    "TokenizerInfo",
    "default_tokenizer_path",
    "fingerprint",
    "load",
]

DEFAULT_TOKENIZER = "stdlib-bpe-16k"

# Files that define a tokenizer's behaviour (never model weights).
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
)


def default_tokenizer_path() -> Path:
    """The byte-level BPE shipped in this package (trained on the stdlib docstrings)."""
    return Path(str(resources.files("tokenloom.tokenize") / "assets" / DEFAULT_TOKENIZER))


def _hf_env() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def _tokenizer_dir(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name_or_path, local_files_only=True))
    except Exception as exc:  # not a local dir and not in the local cache
        raise ConfigError(
            f"tokenizer {name_or_path!r} is neither a local directory nor a name in the local "
            f"Hugging Face cache ({type(exc).__name__}: {exc})",
            field="tokenizer",
            hint="Pass the path of a saved tokenizer directory (tokenizer.json and its config), "
            "or download it once with `huggingface-cli download NAME` where a network is available",
        ) from exc


def fingerprint(name_or_path: str) -> str:
    """sha256 over the names and bytes of the tokenizer's defining files."""
    root = _tokenizer_dir(name_or_path)
    digest = hashlib.sha256()
    found = 0
    for name in _TOKENIZER_FILES:
        path = root / name
        if path.is_file():
            found += 1
            digest.update(name.encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    if found == 0:
        raise ConfigError(
            f"tokenizer directory {root} holds none of {', '.join(_TOKENIZER_FILES)}",
            path=root,
            field="tokenizer",
            hint="Point --tokenizer at a directory written by save_pretrained",
        )
    return "sha256:" + digest.hexdigest()


@dataclass(frozen=True, slots=True)
class TokenizerInfo:
    """What the parent needs to know about a tokenizer, as plain values."""

    eos_id: int | None
    eos_token: str | None
    vocab_size: int
    fast: bool


class LoadedTokenizer:
    """A tokenizer as used in a worker: batch encoding without special tokens."""

    def __init__(self, name_or_path: str) -> None:
        _hf_env()
        from transformers import AutoTokenizer

        self._hf: Any = AutoTokenizer.from_pretrained(_tokenizer_dir(name_or_path))
        backend = getattr(self._hf, "backend_tokenizer", None) if self._hf.is_fast else None
        self._backend: Any = backend
        # encode_batch_fast skips offset tracking; it exists from tokenizers 0.21 on.
        self._encode = getattr(backend, "encode_batch_fast", None) or getattr(backend, "encode_batch", None)

    def info(self) -> TokenizerInfo:
        eos_id = self._hf.eos_token_id
        return TokenizerInfo(
            eos_id=int(eos_id) if eos_id is not None else None,
            eos_token=self._hf.eos_token,
            vocab_size=len(self._hf),
            fast=self._backend is not None,
        )

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if self._encode is not None:
            return [encoding.ids for encoding in self._encode(texts, add_special_tokens=False)]
        return self._hf(texts, add_special_tokens=False)["input_ids"]


_CACHE: dict[str, LoadedTokenizer] = {}


def load(name_or_path: str) -> LoadedTokenizer:
    """The tokenizer for ``name_or_path``, built once per process on first use."""
    tokenizer = _CACHE.get(name_or_path)
    if tokenizer is None:
        tokenizer = _CACHE[name_or_path] = LoadedTokenizer(name_or_path)
    return tokenizer
