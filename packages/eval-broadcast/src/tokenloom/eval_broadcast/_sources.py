"""Eval-set sources: callables that ``broadcast_eval_set`` runs on the source rank, with a ``fingerprint()``.

- :class:`HFEvalSource`: a Hugging Face split, KempnerForge semantics (text field,
  add_special_tokens=False plus EOS, concatenated, cut into seq_len + 1 rows). A text that
  encodes to no tokens is a lone EOS by default (as tokenloom.datasets' HuggingFaceDataset);
  ``compat="kempnerforge"`` or ``skip_empty=True`` skips it, as KempnerForge does.
- :class:`PathEvalSource`: any dataset ``tokenloom.formats.open_dataset`` opens (a ``val/`` directory, or a URL:
  ``s3://``, ``gs://``, ``az://``, ``https://``, read through the node-local block cache).
- any callable returning rows or a stream (``cache_key=`` makes it cacheable).

The fingerprint never tokenizes: local files are hashed (xxh3-128), a hub dataset is
named by (name, config, split, revision); the tokenizer by its serialised form.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from tokenloom.datasets import data_fingerprint, settings_fingerprint
from tokenloom.eval_broadcast._rows import EvalTokens
from tokenloom.eval_broadcast._tokenize import encode_documents
from tokenloom.formats import (
    ConfigError,
    DataError,
    MissingFileError,
    MissingKeyError,
    RecordError,
    RemoteOptions,
    TokenDataset,
    UnsafePathError,
    open_dataset,
)
from tokenloom.formats.io import file_checksum, is_remote_url, require, smallest_dtype_for_vocab

__all__ = ["HFEvalSource", "PathEvalSource"]

log = logging.getLogger("tokenloom.eval_broadcast")


class PathEvalSource:
    """The token stream of a dataset on disk or in object storage (any format ``open_dataset`` reads).

    ``open_options`` go to ``open_dataset``. A URL is read with ``remote`` (a ``RemoteOptions``: store,
    credentials, block cache, default ``$TOKENLOOM_CACHE_DIR``, not the eval-set cache of ``broadcast_eval_set``).
    The fingerprint of a URL holds every object's size and ETag.
    """

    def __init__(self, path: str | os.PathLike[str], *, remote: RemoteOptions | None = None, **open_options: Any):
        self.path: str | Path = os.fspath(path) if is_remote_url(path) else Path(path)  # a URL stays a URL
        self.remote = remote
        self.open_options = open_options

    def _open(self) -> TokenDataset:
        if self.remote is not None:  # a local path given one is refused by open_dataset
            return open_dataset(self.path, remote=self.remote, **self.open_options)
        return open_dataset(self.path, **self.open_options)

    def fingerprint(self) -> str:
        return settings_fingerprint(kind="path", data=data_fingerprint(self._open()))

    def __call__(self) -> TokenDataset:
        return self._open()


class HFEvalSource:
    """A Hugging Face split tokenized on the source rank only.

    Args:
        name: a ``datasets.load_dataset`` path ("json", "parquet", a local directory, a hub name).
        config: the dataset configuration.
        split: the eval split.
        tokenizer: a saved tokenizer directory (loaded with ``AutoTokenizer``) or a tokenizer instance.
        text_field: the text column.
        data_files: local files for builders such as "json" (hashed for the cache key).
        revision: the hub revision; pin it, or the cache key of a hub dataset cannot see changes.
        batch_size: texts per tokenizer call.
        engine: the encoding engine (tokenloom-tokenize's selection): "auto" (fastokens where it is
            proven identical to Hugging Face tokenizers on a probe set and the split's first texts),
            "hf" or "fast". The ids never depend on it, so neither does the cache key.
        skip_empty: drop texts that encode to no tokens (an empty string; with some tokenizers a
            whitespace-only one) instead of emitting a lone EOS for each. Default: False, or True
            with ``compat="kempnerforge"``. Part of the cache key.
        compat: "kempnerforge" sets KempnerForge's defaults (``skip_empty=True``): with
            ``drop_remainder=True`` the set is KempnerForge's eval tensor.
    """

    def __init__(
        self,
        name: str,
        config: str | None = None,
        *,
        split: str = "validation",
        tokenizer: Any,
        text_field: str = "text",
        data_files: Any = None,
        revision: str | None = None,
        batch_size: int = 1000,
        engine: str = "auto",
        skip_empty: bool | None = None,
        compat: str | None = None,
    ) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size is {batch_size}, expected >= 1", field="batch_size")
        if compat not in (None, "kempnerforge"):
            raise ConfigError(f"compat={compat!r}, expected None or 'kempnerforge'", field="compat")
        if skip_empty is not None and not isinstance(skip_empty, bool):
            raise ConfigError(f"skip_empty={skip_empty!r}, expected True, False or None", field="skip_empty")
        self.skip_empty: bool = skip_empty if skip_empty is not None else compat == "kempnerforge"
        self.name, self.config, self.split = name, config, split
        self.text_field = text_field
        self.data_files = data_files
        self.revision = revision
        self.batch_size = batch_size
        self.engine = engine
        self.engine_record: dict[str, Any] | None = None
        """The engine the last build used and why (``Encoder.record()``)."""
        self._tokenizer = tokenizer
        self.documents_tokenized = 0
        self.documents_skipped = 0
        """Texts that encoded to no tokens and were skipped (``skip_empty``), counted like documents_tokenized."""
        self.on_progress: Callable[[int, int], None] | None = None
        """Called with (documents tokenized, documents in the split) after every batch (a progress bar)."""

    @property
    def tokenizer(self) -> Any:
        if isinstance(self._tokenizer, str | os.PathLike):
            transformers = require(
                "transformers", distribution="tokenloom-eval-broadcast", extra="hf", purpose="HFEvalSource"
            )
            self._tokenizer = _load_tokenizer(transformers, Path(self._tokenizer))
        if self._tokenizer.eos_token_id is None:
            raise ConfigError("the tokenizer defines no EOS token", field="tokenizer", hint="Use a tokenizer with one")
        return self._tokenizer

    def _load(self) -> Any:
        hf_datasets = require("datasets", distribution="tokenloom-eval-broadcast", extra="hf", purpose="HFEvalSource")
        return hf_datasets.load_dataset(
            self.name, self.config, split=self.split, data_files=self.data_files, revision=self.revision
        )

    def _data_fingerprint(self) -> Any:
        files = _local_files(self.data_files) if self.data_files is not None else None
        if files is None and Path(self.name).is_dir():
            files = sorted(str(p) for p in Path(self.name).rglob("*") if p.is_file())
        if files is not None:
            return [(Path(f).name, os.path.getsize(f), file_checksum(f)) for f in files]
        if self.revision is not None:
            return {"revision": self.revision}
        return {"hf_fingerprint": self._load()._fingerprint}  # a hub dataset without a pinned revision

    def fingerprint(self) -> str:
        from tokenloom.datasets import tokenizer_fingerprint  # its module imports torch: only an HF source needs it

        return settings_fingerprint(
            kind="hf",
            name=self.name if not Path(self.name).exists() else Path(self.name).name,
            config=self.config,
            split=self.split,
            text_field=self.text_field,
            data=self._data_fingerprint(),
            tokenizer=tokenizer_fingerprint(self.tokenizer),
            skip_empty=self.skip_empty,
        )

    def __call__(self) -> EvalTokens:
        tokenizer = self.tokenizer
        eos_id = int(tokenizer.eos_token_id)
        source = self._load()
        if self.text_field not in source.column_names:
            raise MissingKeyError(
                f"column {self.text_field!r} is absent from split {self.split!r}, the dataset has "
                f"{source.column_names}",
                field="text_field",
            )
        vocab_size = max(len(tokenizer), eos_id + 1)
        dtype = smallest_dtype_for_vocab(vocab_size)  # 2 bytes a token held on the source, not 8
        from tokenloom.tokenize import load_encoder

        probe = source.select(range(min(256, len(source))))[self.text_field] if len(source) else []
        encoder = load_encoder(tokenizer, self.engine, [t for t in probe if isinstance(t, str)])
        self.engine_record = encoder.record()
        parts: list[np.ndarray] = []
        for batch in source.iter(batch_size=self.batch_size):
            texts = batch[self.text_field]
            for offset, text in enumerate(texts):
                if not isinstance(text, str):
                    raise RecordError(
                        f"row {self.documents_tokenized + offset} of split {self.split!r} has "
                        f"{type(text).__name__} in column {self.text_field!r}, expected a string",
                        record=self.documents_tokenized + offset,
                        field=self.text_field,
                        hint="Fix or drop that record (every eval text is tokenized; none is skipped silently)",
                    )
            tokens, lengths = encode_documents(tokenizer, texts, eos_id, encoder=encoder, skip_empty=self.skip_empty)
            self.documents_skipped += len(texts) - len(lengths)
            self.documents_tokenized += len(texts)
            parts.append(tokens.astype(dtype))
            if self.on_progress is not None:
                self.on_progress(self.documents_tokenized, len(source))
        stream = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
        if self.documents_skipped:
            log.info("skipped %d texts that encode to no tokens (skip_empty)", self.documents_skipped)
        return EvalTokens(stream, eos_id=eos_id, vocab_size=vocab_size)


def _local_files(data_files: Any) -> list[str] | None:
    """Every local file named by ``data_files`` (a path, a list, or a dict of split -> paths), sorted."""
    if isinstance(data_files, dict):
        names: Iterable[Any] = [v for value in data_files.values() for v in _as_list(value)]
    else:
        names = _as_list(data_files)
    found: list[str] = []
    for name in names:
        text = os.fspath(name)
        if "://" in text:
            return None  # remote files: fall back to the revision / HF fingerprint
        matches = sorted(glob.glob(text)) if any(c in text for c in "*?[") else [text]
        if not matches:
            raise MissingFileError(f"data file {text!r} does not exist", path=text, field="data_files")
        for match in matches:
            if os.path.isfile(match):
                continue
            if os.path.lexists(match):  # a FIFO, a directory, a device, a dangling or looping symlink
                raise UnsafePathError(
                    f"data file {match!r} is not a regular file (a FIFO, directory, device or broken symlink)",
                    path=match,
                    field="data_files",
                    hint="Pass regular files only: a FIFO would block the build, a symlink loop has no content",
                )
            raise MissingFileError(f"data file {match!r} does not exist", path=match, field="data_files")
        found.extend(matches)
    return sorted(found)


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _load_tokenizer(transformers: Any, directory: Path) -> Any:
    """AutoTokenizer on a saved directory (or a cached name); failures are named errors, not loader tracebacks."""
    try:
        return transformers.AutoTokenizer.from_pretrained(os.fspath(directory))
    except (DataError, KeyboardInterrupt):
        raise
    except Exception as exc:  # transformers/tokenizers raise plain exceptions (JSONDecodeError, ...) on bad files
        if not directory.exists():
            raise MissingFileError(
                f"tokenizer {os.fspath(directory)!r} is neither a directory nor a locally cached name",
                path=directory,
                field="tokenizer",
                hint="Pass --tokenizer a directory written by save_pretrained",
            ) from exc
        raise ConfigError(
            f"the tokenizer could not be loaded ({type(exc).__name__}: {exc})",
            path=directory,
            field="tokenizer",
            hint="The tokenizer files are damaged: save the tokenizer again (save_pretrained) or re-copy them",
        ) from exc
