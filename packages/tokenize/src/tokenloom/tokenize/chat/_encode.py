"""Records -> the arrays a post-training store holds, with the length policy and counts.

- sft: ``sequence``, ``loss_mask``, ``position_ids`` (one record per conversation);
- dpo: ``chosen``, ``rejected``, ``chosen_mask``, ``rejected_mask`` (one record per pair; the two sides
  share the prompt's tokens, checked);
- grpo: ``prompts`` (the prompt rendered with the generation prompt), ``responses`` and ``masks`` (one
  per response: the tokens after the prompt's), ``rewards``.

A record longer than ``seq_len`` follows ``truncate``: ``skip`` (the default: counted, never a
silent cut), ``keep-start`` or ``keep-end``; a cut that leaves no trained token is a counted skip.
A dpo pair cut ``keep-end`` loses the same prompt tokens on both sides (so they still share a
prompt); one whose cut would leave no prompt is a counted skip.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Collection, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from tokenloom.formats.errors import ConfigError, ConversationError, RecordError, TemplatePrefixError
from tokenloom.tokenize.chat._layout import common as _common
from tokenloom.tokenize.chat._masks import MaskedTokens, derive_mask
from tokenloom.tokenize.chat._records import ROLES, Conversation, dpo_pair, grpo_group, sft_conversation
from tokenloom.tokenize.chat._template import NOWHERE, ChatTokenizer, RecordPlace
from tokenloom.tokenize.windowing import member

__all__ = ["ChatEncoder", "PostTrainingStats", "TrainType", "Truncate"]


class TrainType(StrEnum):
    SFT = "sft"
    DPO = "dpo"
    GRPO = "grpo"


class Truncate(StrEnum):
    """What happens to a record longer than ``seq_len``."""

    SKIP = "skip"
    KEEP_START = "keep-start"
    KEEP_END = "keep-end"


@dataclass(slots=True)
class PostTrainingStats:
    """Counts of one run, saved beside the store (``tokenloom inspect --records`` shows them)."""

    records: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    truncated: int = 0
    skipped_too_long: int = 0
    skipped_errors: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def skip_error(self, exc: RecordError, on_error: str) -> None:
        """Count a bad record skipped by error name (``on_error`` skip); re-raise it under raise."""
        if on_error == "raise":
            raise exc
        self.skipped_errors += 1
        self.errors = dict(sorted((Counter(self.errors) + Counter([type(exc).__name__])).items()))


def encoded(encoder: Any, records: Iterable[Any]) -> Iterator[dict[str, Any]]:
    """The arrays ``encoder`` gives ``records`` (dicts, or ``(record, RecordPlace)`` pairs), in order, skipped
    records left out."""
    for item in records:
        record, place = item if isinstance(item, tuple) else (item, NOWHERE)
        arrays = encoder.encode(record, place)
        if arrays is not None:
            yield arrays


def check_roles(train_roles: Collection[str], seq_len: int | None) -> tuple[tuple[str, ...], int | None]:
    """The trained roles (some of ROLES) and the record length (>= 2, or None), or a ConfigError."""
    roles = tuple(train_roles)
    bad = [role for role in roles if role not in ROLES]
    if not roles or bad:
        raise ConfigError(f"train roles {list(roles)}, expected some of {list(ROLES)}", field="train_roles")
    if seq_len is not None and (isinstance(seq_len, bool) or seq_len < 2):
        raise ConfigError(f"seq_len is {seq_len}, expected >= 2", field="seq_len")
    return roles, seq_len


def check_on_error(on_error: str) -> str:
    if on_error not in ("raise", "skip"):
        raise ConfigError(f"on_error {on_error!r}, expected 'raise' or 'skip'", field="on_error")
    return on_error


class ChatEncoder:
    """Turn post-training records into store arrays (see the module docstring).

    Args:
        tokenizer: a tokenizer directory or a loaded transformers tokenizer, or a :class:`ChatTokenizer`.
        chat_template: a Jinja file (or text) replacing the tokenizer's template.
        train_type: sft, dpo or grpo.
        train_roles: the roles whose turns are trained (default: assistant).
        seq_len: the longest record kept as it is (tokens of a record, of each dpo side, of a grpo
            prompt plus its longest response); None: no limit.
        truncate: skip, keep-start or keep-end (see :class:`Truncate`).
        on_error: "raise" (the first bad record stops the run) or "skip" (count it by error name).
        engine: auto (the renderings encoded by fastokens where proven equal to tokenizers, see
            :mod:`._fast`), hf or fast (an error where it is not proven). Never changes the output.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        chat_template: str | os.PathLike[str] | None = None,
        train_type: TrainType | str = TrainType.SFT,
        train_roles: Collection[str] = ("assistant",),
        seq_len: int | None = None,
        truncate: Truncate | str = Truncate.SKIP,
        on_error: str = "raise",
        engine: str = "auto",
    ) -> None:
        self.chat = (
            tokenizer
            if isinstance(tokenizer, ChatTokenizer)
            else ChatTokenizer(tokenizer, chat_template=chat_template, engine=engine)
        )
        self.train_type = member(TrainType, train_type, "train_type")
        self.truncate = member(Truncate, truncate, "truncate")
        self.train_roles, self.seq_len = check_roles(train_roles, seq_len)
        self.on_error = check_on_error(on_error)
        self.stats = PostTrainingStats()

    def settings(self) -> dict[str, Any]:
        """What changes the output (saved beside the store)."""
        return {
            "train_type": self.train_type.value,
            "train_roles": list(self.train_roles),
            "max_length": self.seq_len,  # recorded key: earlier manifests resume
            "truncate": self.truncate.value,
            "chat_template": self.chat.template,
        }

    def encode(self, record: Any, place: RecordPlace = NOWHERE) -> dict[str, Any] | None:
        """The store arrays of one record, or None when it is skipped (counted in ``stats``)."""
        try:
            if self.train_type is TrainType.SFT:
                arrays = self._sft(record, place)
            elif self.train_type is TrainType.DPO:
                arrays = self._dpo(record, place)
            else:
                arrays = self._grpo(record, place)
        except RecordError as exc:
            self.stats.skip_error(exc, self.on_error)
            return None
        if arrays is None:
            self.stats.skipped_too_long += 1
            return None
        self.stats.records += 1
        return arrays

    def _derive(self, conversation: Conversation, place: RecordPlace, after: str | None = None) -> MaskedTokens:
        return derive_mask(self.chat, conversation, self.train_roles, place, after=after)

    def _cut(self, ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """The record within seq_len, or None for a skip."""
        limit = self.seq_len
        if limit is None or len(ids) <= limit:
            return ids, mask
        if self.truncate is Truncate.SKIP:
            return None
        piece = slice(0, limit) if self.truncate is Truncate.KEEP_START else slice(len(ids) - limit, len(ids))
        ids, mask = ids[piece], mask[piece]
        if not mask.any() or mask.all():
            return None
        return ids, mask

    def _count(self, *masks: np.ndarray, truncated: bool) -> None:
        self.stats.tokens += sum(len(m) for m in masks)
        self.stats.trained_tokens += sum(int(m.sum()) for m in masks)
        self.stats.truncated += int(truncated)

    def _sft(self, record: Any, place: RecordPlace) -> dict[str, Any] | None:
        masked = self._derive(sft_conversation(record, place), place)
        cut = self._cut(masked.ids, masked.mask)
        if cut is None:
            return None
        ids, mask = cut
        self._count(mask, truncated=len(ids) < len(masked.ids))
        return {"sequence": ids, "loss_mask": mask, "position_ids": np.arange(len(ids), dtype=np.int32)}

    def _dpo(self, record: Any, place: RecordPlace) -> dict[str, Any] | None:
        sides = dpo_pair(record, place)
        chosen, rejected = (self._derive(side, place) for side in sides)
        before = [side.messages[: masked.spans[0].turn] for side, masked in zip(sides, (chosen, rejected), strict=True)]
        if before[0] != before[1]:
            raise ConversationError(
                f"chosen and rejected have different prompts: {len(before[0])} and {len(before[1])} messages "
                "before their first trained turn, not the same messages",
                field="prompt",
                hint="A preference pair continues one prompt: give chosen and rejected the same messages up to "
                "their first trained turn, or pass --on-error skip to count and skip such records",
                **place.where(),
            )
        # up to the earlier trained start (a start may sit at a token's edge, off the content's first character)
        start = min(side.spans[0].start for side in (chosen, rejected))
        if chosen.text[:start] != rejected.text[:start]:
            raise TemplatePrefixError(
                "the prompt renders differently before chosen and before rejected (the template renders the "
                f"prompt depending on the continuation; they part at character {_common(chosen.text, rejected.text)})",
                field="prompt",
                **place.where(),
            )
        if self.truncate is Truncate.KEEP_END and self.seq_len is not None:
            # both sides lose the same prompt tokens, so they still continue one prompt (no prompt left: skip)
            drop = max(len(chosen.ids), len(rejected.ids)) - self.seq_len
            if drop >= min(int(np.argmax(side.mask)) for side in (chosen, rejected)):
                return None
            chosen_cut, rejected_cut = (
                (side.ids[max(drop, 0) :], side.mask[max(drop, 0) :]) for side in (chosen, rejected)
            )
        else:
            chosen_cut, rejected_cut = self._cut(chosen.ids, chosen.mask), self._cut(rejected.ids, rejected.mask)
        if chosen_cut is None or rejected_cut is None:
            return None
        (c_ids, c_mask), (r_ids, r_mask) = chosen_cut, rejected_cut
        self._count(c_mask, r_mask, truncated=len(c_ids) < len(chosen.ids) or len(r_ids) < len(rejected.ids))
        return {"chosen": c_ids, "chosen_mask": c_mask, "rejected": r_ids, "rejected_mask": r_mask}

    def _grpo(self, record: Any, place: RecordPlace) -> dict[str, Any] | None:
        prompt, tools, turns, rewards = grpo_group(record, place)
        prompt_text = self.chat.render(prompt, tools=tools, add_generation_prompt=True, place=place)
        prompt_ids, _ = self.chat.encode(prompt_text)
        responses, masks = [], []
        for continuation in turns:
            masked = self._derive(Conversation(prompt + continuation, tools, len(prompt)), place, after=prompt_text)
            responses.append(masked.ids)
            masks.append(masked.mask)
        longest = max(len(r) for r in responses)
        limit = self.seq_len
        truncated = False
        if limit is not None and len(prompt_ids) + longest > limit:
            if self.truncate is Truncate.SKIP:
                return None
            truncated = True
            if self.truncate is Truncate.KEEP_START:
                room = limit - len(prompt_ids)
                if room < 1:
                    return None
                responses, masks = [r[:room] for r in responses], [m[:room] for m in masks]
                if not all(m.any() for m in masks):
                    return None
            else:
                room = limit - longest
                if room < 1:
                    return None
                prompt_ids = prompt_ids[len(prompt_ids) - room :]
        self._count(*masks, truncated=truncated)
        self.stats.tokens += len(prompt_ids)
        return {
            "prompts": prompt_ids,
            "responses": responses,
            "masks": masks,
            "rewards": np.asarray(rewards, dtype=np.float32),
        }
