"""Write post-training records into a record store (:class:`tokenloom.formats.RecordStoreWriter`).

The store opens with :func:`tokenloom.formats.open_records` (and sft also as a keyed store:
``DatasetFactory.load("sft", OUT, window_size)``); ``post_training.json`` beside it holds the
settings and counts (records, truncated, skipped) that ``tokenloom inspect OUT --records N`` shows.
It is written before the store's meta.json, which is published last.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from tokenloom.formats import ConfigError, RecordStoreWriter
from tokenloom.formats.io import atomic_write_bytes
from tokenloom.formats.keyed.records import POST_TRAINING_SIDECAR
from tokenloom.tokenize.chat._encode import ChatEncoder, PostTrainingStats
from tokenloom.tokenize.chat._template import NOWHERE

__all__ = ["SIDECAR_NAME", "write_post_training"]

SIDECAR_NAME = POST_TRAINING_SIDECAR
SIDECAR_VERSION = 1


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
    ``train_roles``, ``max_length``, ``truncate``, ``on_error``). Returns the counts.
    """
    if encoder is None:
        encoder = ChatEncoder(tokenizer, train_type=train_type, **options)
    elif options or tokenizer is not None or encoder.train_type.value != train_type:
        raise ConfigError(
            "pass either an encoder (of this train_type) or a tokenizer and options, not both", field="encoder"
        )
    vocab = encoder.chat.vocab_size
    dtype = np.uint16 if vocab <= 1 << 16 else np.uint32
    out = Path(out_dir)
    mask_dtypes = {"loss_mask": "bool", "chosen_mask": "bool", "rejected_mask": "bool", "masks": "bool"}
    writer = RecordStoreWriter(
        out,
        train_type=encoder.train_type.value,
        dtype=dtype,
        vocab_size=vocab,
        key_dtypes=mask_dtypes,
        overwrite=overwrite,
    )
    try:
        for item in records:
            record, place = item if isinstance(item, tuple) else (item, NOWHERE)
            arrays = encoder.encode(record, place)
            if arrays is not None:
                writer.add_record(arrays)
        sidecar = {
            "tokenloom_post_training": SIDECAR_VERSION,
            **encoder.settings(),
            "chat_template_sha256": hashlib.sha256(encoder.chat.template.encode()).hexdigest(),
            "tokenizer": _tokenizer_name(encoder),
            "stats": encoder.stats.as_dict(),
        }
        del sidecar["chat_template"]
        atomic_write_bytes(out / SIDECAR_NAME, orjson.dumps(sidecar, option=orjson.OPT_INDENT_2))
    except BaseException:
        writer.abort()
        with contextlib.suppress(FileNotFoundError):
            (out / SIDECAR_NAME).unlink()
        raise
    writer.close()
    return encoder.stats


def _tokenizer_name(encoder: ChatEncoder) -> str:
    """The tokenizer's directory (absolute, so inspect finds it from anywhere) or name."""
    name = str(getattr(encoder.chat.hf, "name_or_path", "") or "")
    return str(Path(name).resolve()) if name and Path(name).exists() else name
