"""Loading a Hugging Face tokenizer lazily, its fingerprint, and batch encoding.

The parent process never loads a tokenizer through transformers: :func:`describe`
runs in a short-lived child: it loads the tokenizer through ``AutoTokenizer`` and
sends back plain values (EOS id, vocab size) and the fast backend serialized
as JSON (:func:`describe_plain` reads a plain ``tokenizer.json`` directly). Encoding
workers rebuild the Rust tokenizer from that JSON on first use, so they never import
transformers (which imports torch when installed: seconds and hundreds of MB per
worker); with the fast engine the encoding threads of the parent do the same. A
tokenizer used before a fork can deadlock the children (the `tokenizers` fork issue):
worker processes come from a fork server or spawn, never from a fork of a process that
holds one. Slow (Python) tokenizers are loaded through ``AutoTokenizer`` in each worker.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from tokenloom.formats import ConfigError

__all__ = [
    "DEFAULT_TOKENIZER",
    "BackendTokenizer",
    "LoadedTokenizer",
    "TokenizerInfo",
    "default_tokenizer_path",
    "describe",
    "describe_plain",
    "fingerprint",
    "load",
    "local_info",
    "plain_backend",
    "register_serialized",
]

DEFAULT_TOKENIZER = "stdlib-bpe-16k"
#: The command that fills the local Hugging Face cache with a tokenizer's files: ``hf`` is the CLI that
#: huggingface_hub installs (from 1.0 on it no longer installs ``huggingface-cli``).
DOWNLOAD_HINT = 'hf download {name} --include "*.json" --include "*.txt" --include "*.model"'

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
    """The directory of the byte-level BPE shipped in this package (16k vocabulary, trained on the stdlib docstrings).

    It is what ``tokenize``, ``pack`` and the demo use when no tokenizer is given, and a
    plain ``save_pretrained`` directory, so anything that takes a tokenizer path takes it::

        from transformers import AutoTokenizer
        from tokenloom.tokenize import default_tokenizer_path

        tokenizer = AutoTokenizer.from_pretrained(default_tokenizer_path())
        print(tokenizer.eos_token, tokenizer.eos_token_id, len(tokenizer))
    """
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
            "or, where a network is available, download its tokenizer files once into that cache with "
            f"`{DOWNLOAD_HINT.format(name=name_or_path)}`",
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


@contextlib.contextmanager
def _torch_hidden() -> Iterator[None]:
    """Make ``import torch`` fail while transformers loads, in a child process only.

    transformers imports torch whenever it is installed (seconds and ~700 MB per
    process), and a tokenizer never needs it. Only used in worker processes.
    """
    if "torch" in sys.modules:
        yield
        return
    sys.modules["torch"] = None  # type: ignore[assignment]  # import torch -> ImportError
    try:
        yield
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]


class Encoder(Protocol):
    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...


class LoadedTokenizer:
    """A tokenizer loaded through ``AutoTokenizer``: batch encoding without special tokens."""

    def __init__(self, name_or_path: str, *, hide_torch: bool = False) -> None:
        _hf_env()
        directory = _tokenizer_dir(name_or_path)
        try:
            with _torch_hidden() if hide_torch else contextlib.nullcontext():
                self._hf = _auto_tokenizer(directory)
        except Exception:  # a tokenizer that does need torch: load it the ordinary way
            if not hide_torch:
                raise
            self._hf = _auto_tokenizer(directory)
        backend = getattr(self._hf, "backend_tokenizer", None) if self._hf.is_fast else None
        self._backend: Any = backend
        self._encode = batch_ids(backend) if backend is not None else None

    def info(self) -> TokenizerInfo:
        eos_id = self._hf.eos_token_id
        return TokenizerInfo(
            eos_id=int(eos_id) if eos_id is not None else None,
            eos_token=self._hf.eos_token,
            vocab_size=len(self._hf),
            fast=self._backend is not None,
        )

    @property
    def backend(self) -> Any:
        """The Rust ``tokenizers.Tokenizer`` transformers configured, or None for a slow tokenizer."""
        return self._backend

    @property
    def transformers(self) -> Any:
        """The transformers tokenizer itself."""
        return self._hf

    def backend_json(self) -> str | None:
        """The Rust tokenizer exactly as transformers configured it, or None for a slow tokenizer."""
        return self._backend.to_str() if self._backend is not None else None

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if self._encode is not None:
            return self._encode(texts)
        return self._hf(texts, add_special_tokens=False)["input_ids"]


class BackendTokenizer:
    """The fast Rust tokenizer rebuilt from :meth:`LoadedTokenizer.backend_json` (no transformers import)."""

    def __init__(self, serialized: str) -> None:
        from tokenizers import Tokenizer

        self.backend = Tokenizer.from_str(serialized)
        self._encode = batch_ids(self.backend)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self._encode(texts)


def _auto_tokenizer(directory: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


def batch_ids(backend: Any) -> Callable[[list[str]], list[list[int]]]:
    """The ids of each text of a batch through a ``tokenizers.Tokenizer``, without special tokens."""
    # encode_batch_fast skips offset tracking; it exists from tokenizers 0.21 on.
    encode = getattr(backend, "encode_batch_fast", None) or backend.encode_batch
    return lambda texts: [encoding.ids for encoding in encode(texts, add_special_tokens=False)]


def describe(name_or_path: str) -> tuple[TokenizerInfo, str | None]:
    """Load through AutoTokenizer (in a short-lived worker): plain facts and the serialized backend."""
    tokenizer = LoadedTokenizer(name_or_path, hide_torch=True)
    return tokenizer.info(), tokenizer.backend_json()


# tokenizer_config.json keys that PreTrainedTokenizerFast does not turn into changes
# of the Rust backend's encoding (special-token names, lengths, padding sides, ...).
_PLAIN_CONFIG_KEYS = frozenset(
    {
        "tokenizer_class",
        "model_max_length",
        "clean_up_tokenization_spaces",
        "bos_token",
        "eos_token",
        "unk_token",
        "pad_token",
        "sep_token",
        "cls_token",
        "mask_token",
        "additional_special_tokens",
        "extra_special_tokens",
        "added_tokens_decoder",
        "model_input_names",
        "padding_side",
        "truncation_side",
    }
)


def _token_name(value: Any) -> str | None:
    """A special token's text: the string itself, or the ``content`` of its dict form."""
    content = value.get("content") if isinstance(value, dict) else value
    return content if isinstance(content, str) else None


def describe_plain(name_or_path: str) -> tuple[TokenizerInfo, str] | None:
    """The same facts as :func:`describe` without importing transformers, where that is exact (see plain_backend)."""
    plain = plain_backend(name_or_path)
    return None if plain is None else (plain[0], plain[1].to_str())


def plain_backend(name_or_path: str) -> tuple[TokenizerInfo, Any] | None:
    """:func:`describe_plain`'s facts and the ``tokenizers.Tokenizer`` it read (to encode with in this process).

    Why: importing transformers costs about a second per run. For a local directory
    whose ``tokenizer_config.json`` names the generic ``PreTrainedTokenizerFast`` and
    holds only keys that do not change encoding, AutoTokenizer uses ``tokenizer.json``
    as it is, so reading it with ``tokenizers`` gives the same ids. Anything else
    (another tokenizer class, an EOS token missing from the vocabulary, tokens the
    config would add) returns None and goes through transformers.
    """
    import json

    root = Path(name_or_path)
    config_path, backend_path = root / "tokenizer_config.json", root / "tokenizer.json"
    if not (root.is_dir() and config_path.is_file() and backend_path.is_file()):
        return None
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        special = root / "special_tokens_map.json"
        special_map = json.loads(special.read_text(encoding="utf-8")) if special.is_file() else {}
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or not isinstance(special_map, dict):
        return None
    if config.get("tokenizer_class") != "PreTrainedTokenizerFast" or set(config) - _PLAIN_CONFIG_KEYS:
        return None
    from tokenizers import Tokenizer

    try:
        backend = Tokenizer.from_file(str(backend_path))
    except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
        raise ConfigError(
            f"Hugging Face tokenizers cannot load this tokenizer.json ({exc})",
            path=backend_path,
            field="tokenizer",
            hint="Re-save the tokenizer with save_pretrained, or point --tokenizer at another directory",
        ) from exc
    added = config.get("added_tokens_decoder", {})
    if not isinstance(added, dict) or any(
        backend.token_to_id(_token_name(token) or "") != int(index) for index, token in added.items()
    ):
        return None  # transformers would add or move tokens
    for key in ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"):
        name = _token_name(config.get(key, special_map.get(key)))
        if name is not None and backend.token_to_id(name) is None:
            return None  # transformers would add it to the vocabulary
    eos_token = _token_name(config.get("eos_token", special_map.get("eos_token")))
    eos_id = backend.token_to_id(eos_token) if eos_token is not None else None
    info = TokenizerInfo(
        eos_id=eos_id, eos_token=eos_token, vocab_size=backend.get_vocab_size(with_added_tokens=True), fast=True
    )
    return info, backend


_CACHE: dict[str, Encoder] = {}
_SERIALIZED: dict[str, str] = {}


def register_serialized(name_or_path: str, serialized: str | None) -> None:
    """In a worker: build ``name_or_path`` from this JSON instead of through transformers."""
    if serialized is not None:
        _SERIALIZED[name_or_path] = serialized


def load(name_or_path: str) -> Encoder:
    """The tokenizer for ``name_or_path``, built once per process on first use."""
    tokenizer = _CACHE.get(name_or_path)
    if tokenizer is None:
        serialized = _SERIALIZED.get(name_or_path)
        if serialized is not None:
            tokenizer = BackendTokenizer(serialized)
        else:
            tokenizer = LoadedTokenizer(name_or_path, hide_torch=_in_worker())
        _CACHE[name_or_path] = tokenizer
    return tokenizer


def is_loaded(name_or_path: str) -> bool:
    """Whether :func:`load` has built ``name_or_path`` in this process already."""
    return name_or_path in _CACHE


def local_info(name_or_path: str) -> TokenizerInfo:
    """Load ``name_or_path`` in this process (``num_workers=0``) and describe it."""
    tokenizer = load(name_or_path)
    if not isinstance(tokenizer, LoadedTokenizer):
        tokenizer = LoadedTokenizer(name_or_path)
    return tokenizer.info()


def _in_worker() -> bool:
    import multiprocessing

    return multiprocessing.parent_process() is not None
