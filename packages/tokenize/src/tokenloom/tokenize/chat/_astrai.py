"""AstrAI's preprocessing, record by record: the same ``sequence``, ``loss_mask`` and ``position_ids`` as its
``Pipeline`` for sft and pretrain configs (``--astrai-config pipeline.json``).

What AstrAI does (``astrai/preprocessing/builder.py``, ``pipeline.py``, ``astrai/tokenize/``), and so this module:

1. The tokenizer is ``tokenizer.json`` loaded by ``tokenizers``; its chat template is ``tokenizer_config.json``'s
   ``chat_template``; BOS is the id of ``tokenizer_config.json``'s ``special_tokens.bos_token`` (AstrAI's own
   key: a Hugging Face directory with only a top-level ``bos_token`` has no BOS here).
2. A template section (``template: true``) reads a list of messages and renders **each message on its own**
   (``messages=[message]``, ``add_generation_prompt=False``, no other variables, Jinja's default options: no
   ``trim_blocks``, no ``bos_token``), encodes the text without special tokens, and marks all its tokens with
   the message role's action (``$role`` -> ``mask[role]`` or ``mask_default``). A config with a template section
   starts every record with BOS (masked). A field that is not a non-empty list is left out.
3. A text section encodes ``str(record[field])`` (left out when blank), with special tokens for the first
   non-template section unless ``add_special_tokens`` says otherwise; its tokens take the section's action.
   A text config (no template, all sections trained; AstrAI's pretraining) skips texts outside
   [``min_chars``, ``max_chars``] and writes no ``loss_mask``.
4. The record is cut to ``max_seq_len`` tokens (its start kept); no tokens, or only BOS: skipped.
5. ``position_ids``: doc_reset ``0..n-1``; then every key is cut to ``max_packed_len`` by ``truncation_mode``
   (AstrAI's ``simple`` packing, which cuts position ids too: a keep_end cut keeps the last positions);
   continuous: positions run on across the records of one of AstrAI's shards (a new shard once the records'
   tokens reach ``max_tokens_per_shard``); none: no ``position_ids``.
6. ``max_items``: the run stops after that many records kept.

Where tokenloom differs, on purpose: a record AstrAI drops with a log line (a Jinja error, a message that is not
an object, a record that is not an object) is a named error, or a counted skip with ``on_error="skip"``; a
sft record whose tokens are all trained keeps a ``loss_mask`` of ones (AstrAI's writer pads the missing key
with zeros when an earlier record of the shard had one, so the record trains nothing); truncation and padding
stored in ``tokenizer.json`` are off (they would cut each message). Texts encoded without special tokens go
through tokenize's engine (fastokens where proven equal to ``tokenizers``, see :mod:`tokenloom.tokenize.engine`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from tokenloom.formats.errors import ChatTemplateError, ConfigError, ConversationError, RecordError
from tokenloom.tokenize.chat._astrai_config import AstraiConfig, PositionIds
from tokenloom.tokenize.chat._encode import PostTrainingStats, check_on_error, encoded
from tokenloom.tokenize.chat._template import NOWHERE, RecordPlace, _read_template

__all__ = ["AstraiEncoder", "AstraiStats", "AstraiTokenizer", "records_from_astrai_config"]


@dataclass(slots=True)
class AstraiStats(PostTrainingStats):
    """The counts, plus the records AstrAI leaves out by rule (not error)."""

    dropped_empty: int = 0
    """no tokens, or only BOS (blank fields, a text outside [min_chars, max_chars])"""
    dropped_max_items: int = 0
    """after ``max_items`` records were kept"""


class AstraiTokenizer:
    """A tokenizer directory seen as AstrAI's ``AutoTokenizer`` sees it (point 1 of the module docstring)."""

    def __init__(
        self, directory: str | os.PathLike[str], *, chat_template: str | os.PathLike[str] | None = None, engine="auto"
    ) -> None:
        from jinja2.sandbox import SandboxedEnvironment
        from tokenizers import Tokenizer

        from tokenloom.tokenize.engine import load_encoder

        root = Path(directory)
        if not (root / "tokenizer.json").is_file():
            raise ConfigError(
                "an AstrAI tokenizer is a directory with tokenizer.json (and tokenizer_config.json)",
                path=root,
                field="tokenizer",
            )
        self.backend = Tokenizer.from_file(str(root / "tokenizer.json"))
        config: dict[str, Any] = {}
        if (root / "tokenizer_config.json").is_file():
            try:
                config = orjson.loads((root / "tokenizer_config.json").read_bytes())
            except orjson.JSONDecodeError as exc:
                raise ConfigError(f"tokenizer_config.json is not JSON ({exc})", path=root) from None
        template = _read_template(chat_template) if chat_template is not None else config.get("chat_template")
        self.template: str | None = template if isinstance(template, str) else None
        if template is not None and self.template is None:
            raise ConfigError(
                f"chat_template is a {type(template).__name__}; AstrAI reads a template string",
                path=root / "tokenizer_config.json",
                field="chat_template",
            )
        specials = config.get("special_tokens") or {}
        bos = specials.get("bos_token") if isinstance(specials, dict) else None
        self.bos_id: int | None = self.backend.token_to_id(bos) if isinstance(bos, str) else None
        self.vocab_size = self.backend.get_vocab_size()
        self.name = str(root.resolve())
        self._compiled = SandboxedEnvironment().from_string(self.template) if self.template else None
        self.encoder = load_encoder(self.backend, engine)

    def render(self, message: Any, place: RecordPlace, turn: int) -> str:
        if self._compiled is None:
            raise _no_template()
        try:
            return self._compiled.render(messages=[message], add_generation_prompt=False)
        except Exception as exc:  # whatever the template raises is its error, carried with the record
            raise ChatTemplateError(
                f"the chat template raised {type(exc).__name__}: {exc} rendering message {turn} on its own",
                field=f"messages[{turn}]",
                **place.where(),
            ) from None

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Each text's ids, without special tokens (through the engine)."""
        if not texts:
            return []
        ids, offsets = self.encoder.encode_flat(texts)
        return [ids[offsets[i] : offsets[i + 1]].astype(np.int64) for i in range(len(texts))]

    def encode_special(self, text: str) -> np.ndarray:
        """The ids of ``text`` with the tokenizer's post-processor (BOS/EOS it adds)."""
        return np.asarray(self.backend.encode(text, add_special_tokens=True).ids, dtype=np.int64)


class AstraiEncoder:
    """Records -> AstrAI's arrays (see the module docstring); ``encode`` returns None for a skipped record.

    Records must come in input order through one encoder: continuous position ids and ``max_items`` count
    across records, as AstrAI's single pass does.
    """

    def __init__(
        self,
        config: AstraiConfig | str | os.PathLike[str],
        tokenizer: AstraiTokenizer | str | os.PathLike[str],
        *,
        chat_template: str | os.PathLike[str] | None = None,
        on_error: str = "raise",
        engine: str = "auto",
    ) -> None:
        self.config = config if isinstance(config, AstraiConfig) else AstraiConfig.from_file(config)
        self.chat = self.tokenizer = (
            tokenizer
            if isinstance(tokenizer, AstraiTokenizer)
            else AstraiTokenizer(tokenizer, chat_template=chat_template, engine=engine)
        )
        if self.config.has_template and self.chat.template is None:
            raise _no_template()
        self.on_error = check_on_error(on_error)
        self.train_type = self.config.train_type
        self.stats = AstraiStats()
        self._kept = 0
        self._shard_tokens = 0
        self._shard_position = 0

    def settings(self) -> dict[str, Any]:
        """What changes the output (saved beside the store)."""
        return {
            "train_type": self.train_type,
            "astrai_config": self.config.settings(),
            "chat_template": self.tokenizer.template,
        }

    def encode(self, record: Any, place: RecordPlace = NOWHERE) -> dict[str, np.ndarray] | None:
        limit = self.config.max_items
        if limit and self._kept >= limit:
            self._drop("max_items")
            return None
        try:
            pieces = self._pieces(record, place)
        except RecordError as exc:
            self.stats.skip_error(exc, self.on_error)
            return None
        arrays = self._arrays(pieces)
        if arrays is None:
            self._drop("empty")
        return arrays

    def _drop(self, reason: str) -> None:
        setattr(self.stats, f"dropped_{reason}", getattr(self.stats, f"dropped_{reason}") + 1)

    def _pieces(self, record: Any, place: RecordPlace) -> list[tuple[np.ndarray, int]] | None:
        """(ids, mask value) per rendered message or text, BOS first; None: a text config's text filtered out."""
        config, tokenizer = self.config, self.tokenizer
        if not isinstance(record, dict):
            raise ConversationError(f"the record is {type(record).__name__}, expected a JSON object", **place.where())
        plain: list[tuple[str, int]] = []  # (text, mask value), encoded without special tokens, in one batch
        order: list[tuple[str, Any]] = []
        first = True
        for section in config.sections:
            value = record.get(section.field)
            if section.template:
                if not isinstance(value, list) or not value:
                    continue
                for turn, message in enumerate(value):
                    if not isinstance(message, dict):
                        raise ConversationError(
                            f"{section.field}[{turn}] is {type(message).__name__}, expected a message object",
                            field=section.field,
                            **place.where(),
                        )
                    action = config.action(section, message.get("role", ""))
                    order.append(("plain", len(plain)))
                    plain.append((tokenizer.render(message, place, turn), int(action == "train")))
            else:
                text = str(record.get(section.field, ""))
                if not text.strip():
                    continue
                if config.text_config and (
                    (config.min_chars > 0 and len(text) < config.min_chars) or len(text) > config.max_chars
                ):
                    continue
                special = section.add_special_tokens if section.add_special_tokens is not None else first
                value = int(section.action == "train")
                if special:
                    order.append(("special", (tokenizer.encode_special(text), value)))
                else:
                    order.append(("plain", len(plain)))
                    plain.append((text, value))
            first = False
        encoded = tokenizer.encode([text for text, _ in plain])
        pieces = []
        if config.has_template and tokenizer.bos_id is not None:
            pieces.append((np.asarray([tokenizer.bos_id], dtype=np.int64), 0))
        for kind, item in order:
            pieces.append((encoded[item], plain[item][1]) if kind == "plain" else item)
        return pieces

    def _arrays(self, pieces: list[tuple[np.ndarray, int]] | None) -> dict[str, np.ndarray] | None:
        config = self.config
        if not pieces:
            return None
        ids = np.concatenate([p for p, _ in pieces])[: config.max_seq_len]
        mask = np.concatenate([np.full(len(p), v, dtype=np.uint8) for p, v in pieces])[: len(ids)]
        if len(ids) == 0 or (config.has_template and len(ids) <= 1):
            return None
        full = len(ids)
        positions = np.arange(full, dtype=np.int32)
        piece = slice(0, config.max_packed_len)
        if full > config.max_packed_len and config.truncation_mode == "keep_end":
            piece = slice(full - config.max_packed_len, full)
        ids, mask, positions = ids[piece], mask[piece], positions[piece]
        arrays: dict[str, np.ndarray] = {"sequence": ids}
        if not config.text_config:
            arrays["loss_mask"] = mask
        if config.position_ids_mode is PositionIds.DOC_RESET:
            arrays["position_ids"] = positions
        elif config.position_ids_mode is PositionIds.CONTINUOUS:
            arrays["position_ids"] = np.arange(self._shard_position, self._shard_position + len(ids), dtype=np.int32)
            self._shard_position += len(ids)
            self._shard_tokens += full
            if self._shard_tokens >= config.max_tokens_per_shard:  # AstrAI flushes the shard after this record
                self._shard_tokens = self._shard_position = 0
        self._kept += 1
        self.stats.records += 1
        self.stats.tokens += len(ids)
        self.stats.trained_tokens += int(mask.sum()) if not config.text_config else len(ids)
        self.stats.truncated += int(len(ids) < sum(len(p) for p, _ in pieces))
        return arrays


def _no_template() -> ConfigError:
    return ConfigError(
        "the config has a template section but the tokenizer has no chat template",
        field="chat_template",
        hint="Pass --chat-template FILE.jinja, or add chat_template to tokenizer_config.json",
    )


def records_from_astrai_config(
    config: AstraiConfig | str | os.PathLike[str],
    records: Iterable[Any],
    tokenizer: AstraiTokenizer | str | os.PathLike[str],
    **options: Any,
) -> Iterator[dict[str, np.ndarray]]:
    """The arrays AstrAI's ``Pipeline`` writes for ``records`` (dicts, or ``(record, RecordPlace)`` pairs), in
    order, skipped records left out; ``options``: :class:`AstraiEncoder`'s (``chat_template``, ``on_error``,
    ``engine``)."""
    yield from encoded(AstraiEncoder(config, tokenizer, **options), records)
