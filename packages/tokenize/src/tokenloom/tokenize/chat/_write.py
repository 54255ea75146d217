"""Write post-training records into a record store (:class:`tokenloom.formats.RecordStoreWriter`): one writer.

``write_store`` is the one place records become a store: ``write_post_training`` (a library call on records in
memory) and each unit of a ``tokenize --train-type`` run (``_unit_records``) both write through it. The store
opens with :func:`tokenloom.formats.open_records` (and sft also as a keyed store:
``DatasetFactory.load("sft", OUT, window_size)``); ``post_training.json`` beside it (``sidecar``) holds the
settings and counts (records, truncated, skipped) that ``tokenloom inspect OUT --records N`` shows. It is
written before the store's meta.json, which is published last.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from tokenloom.formats import ConfigError, RecordStoreWriter
from tokenloom.formats.io import atomic_write_bytes
from tokenloom.formats.keyed.records import POST_TRAINING_SIDECAR
from tokenloom.tokenize.chat._astrai import AstraiEncoder
from tokenloom.tokenize.chat._encode import ChatEncoder, PostTrainingStats, encoded

__all__ = ["SIDECAR_NAME", "sidecar", "write_post_training", "write_store"]

SIDECAR_NAME = POST_TRAINING_SIDECAR
SIDECAR_VERSION = 1
MASK_DTYPES = {"loss_mask": "bool", "chosen_mask": "bool", "rejected_mask": "bool", "masks": "bool"}


def write_store(
    out: Path,
    encoder: ChatEncoder | AstraiEncoder,
    records: Iterable[Any],
    *,
    overwrite: bool = False,
    before_close: Callable[[], None] | None = None,
) -> None:
    """Encode ``records`` (dicts, or ``(record, RecordPlace)`` pairs) in order into a record store at ``out``.

    ``before_close``: what to write beside the store before its meta.json publishes it. On any error the
    writer is aborted: nothing is published.
    """
    vocab = encoder.chat.vocab_size
    writer = RecordStoreWriter(
        out,
        train_type=str(encoder.train_type),
        dtype=np.uint16 if vocab <= 1 << 16 else np.uint32,
        vocab_size=vocab,
        key_dtypes=MASK_DTYPES,
        overwrite=overwrite,
    )
    try:
        for arrays in encoded(encoder, records):
            writer.add_record(arrays)
        if before_close is not None:
            before_close()
    except BaseException:
        writer.abort()
        raise
    writer.close()


def sidecar(
    encoder: ChatEncoder | AstraiEncoder,
    stats: dict[str, Any],
    *,
    tokenizer: str,
    template_sha256: str | None = None,
    **extra: Any,
) -> bytes:
    """``post_training.json``: the encoder's settings (its template by hash), the tokenizer, ``extra``, the counts."""
    body = {
        "tokenloom_post_training": SIDECAR_VERSION,
        **{k: v for k, v in encoder.settings().items() if k != "chat_template"},
        "chat_template_sha256": template_sha256 or hashlib.sha256((encoder.chat.template or "").encode()).hexdigest(),
        "tokenizer": str(Path(tokenizer).resolve()) if tokenizer and Path(tokenizer).exists() else tokenizer,
        **extra,
        "stats": stats,
    }
    return orjson.dumps(body, option=orjson.OPT_INDENT_2)


def write_post_training(
    records: Iterable[Any],
    out_dir: str | os.PathLike[str],
    train_type: str,
    *,
    tokenizer: Any = None,
    encoder: ChatEncoder | None = None,
    overwrite: bool = False,
    **options: Any,
) -> PostTrainingStats:
    """Encode ``records`` (dicts, or ``(record, RecordPlace)`` pairs) and write them to ``out_dir``, in order.

    Either pass an ``encoder`` or a ``tokenizer`` plus :class:`ChatEncoder`'s options (``chat_template``,
    ``train_roles``, ``seq_len``, ``truncate``, ``on_error``). Returns the counts.
    """
    if encoder is None:
        encoder = ChatEncoder(tokenizer, train_type=train_type, **options)
    elif options or tokenizer is not None or str(encoder.train_type) != train_type:
        raise ConfigError(
            "pass either an encoder (of this train_type) or a tokenizer and options, not both", field="encoder"
        )
    out = Path(out_dir)
    name = str(getattr(encoder.chat.hf, "name_or_path", "") or "")
    publish = lambda: atomic_write_bytes(  # noqa: E731
        out / SIDECAR_NAME, sidecar(encoder, encoder.stats.as_dict(), tokenizer=name)
    )
    try:
        write_store(out, encoder, records, overwrite=overwrite, before_close=publish)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            (out / SIDECAR_NAME).unlink()
        raise
    return encoder.stats
