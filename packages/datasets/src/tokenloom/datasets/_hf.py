"""HuggingFaceDataset: a Hugging Face dataset tokenized once, cached natively, served as windows.

KempnerForge eager semantics: every text is encoded with
``add_special_tokens=False`` plus EOS, the stream is concatenated and sliced
into ``seq_len + 1`` chunks, the remainder dropped. Beyond the seed, the
tokenized stream is written once as a native tokenloom dataset under a key of
(HF dataset fingerprint, tokenizer fingerprint, settings), so a restart does not
re-tokenize. Texts are encoded by tokenloom-tokenize's engine selection
(:func:`tokenloom.tokenize.load_encoder`: fastokens where it is proven to give the
same ids as Hugging Face ``tokenizers``, else ``tokenizers``), so this cache holds the
same ids as ``tokenloom tokenize`` of the same text.

A text that encodes to no tokens (an empty string) becomes a lone EOS entry by
default; KempnerForge skips it, so every later window shifts against a
KempnerForge run. ``skip_empty=True``, or ``compat="kempnerforge"`` (which sets
it), reproduces KempnerForge's stream exactly. With ``torch.distributed`` initialised, rank 0 builds the cache and
the other ranks wait on a barrier; the cache is published by one atomic
directory rename (no file locks: Lustre and NFS break them).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from tokenloom.datasets._batch import SampleBatch
from tokenloom.datasets._cache_heal import heal_cache, private_cache_dir
from tokenloom.datasets._eos import documents_with_eos
from tokenloom.datasets._state import settings_fingerprint
from tokenloom.datasets._windows import MemoryMappedDataset, check_positive
from tokenloom.formats import ConfigError, MissingFileError, MissingKeyError, open_writer
from tokenloom.formats.io import MANIFEST_NAME, fsync_dir, require, smallest_dtype_for_vocab, storage_error

__all__ = ["HuggingFaceDataset", "tokenizer_fingerprint"]

log = logging.getLogger("tokenloom.datasets")
CACHE_VERSION = 1


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A hash of everything that changes the token ids a tokenizer produces."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        blob = backend.to_str().encode()
    else:
        blob = json.dumps(sorted(tokenizer.get_vocab().items()), default=str).encode()
    extra = json.dumps([type(tokenizer).__name__, tokenizer.eos_token_id, len(tokenizer)]).encode()
    return hashlib.blake2b(blob + extra, digest_size=16).hexdigest()


def _distributed() -> tuple[bool, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return True, torch.distributed.get_rank()
    return False, 0


class HuggingFaceDataset(Dataset[dict[str, torch.Tensor]]):
    """``load_dataset(name, config, split=...)`` tokenized, cached, and cut into windows.

    Args:
        name: a ``datasets.load_dataset`` path or builder ("json", "parquet", a local directory).
        config: the dataset configuration name.
        split: the split to read.
        seq_len: tokens per sample; each sample reads seq_len + 1 tokens.
        tokenizer: a tokenizer directory / name for ``AutoTokenizer``, or a tokenizer instance.
        text_field: the column holding the text.
        pack_sequences: False, True (documents) or "gpt-simple": adds doc_ids etc.
        cache_dir: where tokenized streams are cached; None: ``~/.cache/tokenloom/hf``.
        data_files: passed to ``load_dataset`` (local json / parquet files).
        batch_size: texts per tokenizer call while building the cache.
        position_ids / cu_seqlens: as for :class:`MemoryMappedDataset`.
        skip_empty: drop texts that encode to no tokens (default False: a lone EOS;
            True with ``compat="kempnerforge"``).
        compat: "kempnerforge" sets KempnerForge's defaults (``skip_empty=True``).
        engine: "auto" (fastokens if proven identical to hf on a probe set and the first texts), "hf" or
            "fast"; never changes the ids, so it is not part of the cache key (it is recorded in the cache).
        verify_fraction: with the fast engine, the fraction of texts re-encoded with hf and compared.
        verify_cache: on open, compare every cache file's xxh3 with the cache manifest (default True: a
            flipped byte is caught and the cache rebuilt; it reads the cache once). False: sizes and
            index checksums only, for caches too large to read at every start.
    """

    def __init__(
        self,
        name: str,
        config: str | None = None,
        *,
        split: str = "train",
        seq_len: int,
        tokenizer: Any,
        text_field: str = "text",
        pack_sequences: bool | str = False,
        cache_dir: str | os.PathLike[str] | None = None,
        data_files: Any = None,
        batch_size: int = 1000,
        position_ids: bool = False,
        cu_seqlens: bool = False,
        skip_empty: bool | None = None,
        compat: str | None = None,
        engine: str = "auto",
        verify_fraction: float = 0.001,
        verify_cache: bool = True,
    ) -> None:
        check_positive(seq_len, "seq_len")
        if compat not in (None, "kempnerforge"):
            raise ConfigError(f"compat={compat!r}, expected None or 'kempnerforge'", field="compat")
        self.skip_empty = skip_empty if skip_empty is not None else compat == "kempnerforge"
        hf_datasets = require("datasets", distribution="tokenloom-datasets", extra="hf", purpose="HuggingFaceDataset")
        if isinstance(tokenizer, str | os.PathLike):
            transformers = require(
                "transformers", distribution="tokenloom-datasets", extra="hf", purpose="HuggingFaceDataset"
            )
            tokenizer = transformers.AutoTokenizer.from_pretrained(os.fspath(tokenizer))
        if tokenizer.eos_token_id is None:
            raise ConfigError("the tokenizer defines no EOS token", field="eos_token", hint="Use a tokenizer with one")
        eos_id = int(tokenizer.eos_token_id)
        source = hf_datasets.load_dataset(name, config, split=split, data_files=data_files)
        if text_field not in source.column_names:
            raise MissingKeyError(
                f"column {text_field!r} is absent, the dataset has {source.column_names}", field="text_field"
            )
        settings = {
            "version": CACHE_VERSION,
            "hf_fingerprint": source._fingerprint,
            "tokenizer": tokenizer_fingerprint(tokenizer),
            "text_field": text_field,
            "eos_id": eos_id,
            "skip_empty": self.skip_empty,
        }
        key = settings_fingerprint(**settings)
        root = Path(cache_dir) if cache_dir is not None else Path.home() / ".cache" / "tokenloom" / "hf"
        self.cache_path = root / f"hf-{key}"
        distributed, rank = _distributed()
        failure: Exception | None = None
        if rank == 0:
            heal_cache(self.cache_path, verify_content=verify_cache)
        if rank == 0 and not (self.cache_path / MANIFEST_NAME).exists():
            try:
                engine_choice = (engine, verify_fraction)
                try:
                    self._build(source, tokenizer, text_field, eos_id, settings, batch_size, engine_choice)
                except OSError as exc:
                    if distributed:
                        raise storage_error(exc, self.cache_path, "writing the tokenized cache") from exc
                    self.cache_path = private_cache_dir(self.cache_path, exc)
                    self._build(source, tokenizer, text_field, eos_id, settings, batch_size, engine_choice)
            except Exception as exc:  # every rank must still reach the barrier, or the others hang
                failure = exc
        if distributed:
            torch.distributed.barrier()
        if failure is not None:
            raise failure
        if not (self.cache_path / MANIFEST_NAME).exists():
            raise MissingFileError(
                f"rank {rank}: rank 0 did not publish the tokenized cache",
                path=self.cache_path,
                hint="See rank 0's error; cache_dir must be one directory shared by every rank",
            )
        self.windows = MemoryMappedDataset(
            self.cache_path,
            seq_len,
            pack_sequences=pack_sequences,
            eos_id=eos_id,
            cross_shard=True,
            position_ids=position_ids,
            cu_seqlens=cu_seqlens,
        )

    def _build(
        self,
        source: Any,
        tokenizer: Any,
        text_field: str,
        eos_id: int,
        settings: dict[str, Any],
        batch_size: int,
        engine: tuple[str, float] = ("auto", 0.001),
    ) -> None:
        tokenize = require("tokenloom.tokenize", distribution="tokenloom-datasets", extra="hf", purpose="Encoding text")
        batches = source.iter(batch_size=batch_size)
        first = next(batches, None)
        sample = list(first[text_field][:256]) if first is not None else []
        encoder = tokenize.load_encoder(tokenizer, engine[0], sample, verify_fraction=engine[1])
        from tokenloom.tokenize.engine import announce_engine  # present: required just above

        announce_engine(log, encoder.name, encoder.reason, tokenizer=str(getattr(tokenizer, "name_or_path", "")))
        self.cache_path.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{self.cache_path.name}-", dir=self.cache_path.parent))
        vocab_size = max(len(tokenizer), eos_id + 1)
        try:
            with open_writer(
                scratch,
                format="native",
                dtype=smallest_dtype_for_vocab(vocab_size),
                vocab_size=vocab_size,
                eos_id=eos_id,
                tokenizer_fingerprint=settings["tokenizer"],
                metadata={**settings, "engine": encoder.record()},
                overwrite=True,
            ) as writer:
                for batch in itertools.chain([first] if first is not None else [], batches):
                    ids, offsets = encoder.encode_flat(batch[text_field])
                    tokens, lengths, _ = documents_with_eos(ids, offsets, eos_id, skip_empty=self.skip_empty)
                    if len(lengths):
                        writer.add_batch(tokens, lengths)
            try:
                os.replace(scratch, self.cache_path)
                fsync_dir(self.cache_path.parent)
            except OSError:  # published meanwhile by another process: identical content
                if not (self.cache_path / MANIFEST_NAME).exists():
                    raise
            log.info("tokenized %s into %s", settings["hf_fingerprint"], self.cache_path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(scratch)

    def __len__(self) -> int:
        return len(self.windows)

    def fingerprint(self) -> str:
        return self.windows.fingerprint()

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.windows[index]

    def __getitems__(self, indices: Sequence[int]) -> SampleBatch:
        return self.windows.__getitems__(indices)

    def state_dict(self) -> dict[str, Any]:
        return self.windows.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.windows.load_state_dict(state)
