"""AstrAI's preprocessing config (``pipeline.json``), read into one frozen value.

The fields and defaults are AstrAI's (``astrai/config/preprocess_config.py``, ``docs/guides/preprocessing.md``):

    {"version": 1,
     "input": {"sections": [{"field", "action": "train"|"mask"|"$role"|"value", "template", "add_special_tokens"}]},
     "mask": {role: "train"|"mask"}, "mask_default": "mask",
     "preprocessing": {"max_seq_len": 2048, "min_chars": 50, "max_chars": 2000000, "max_items": null,
                       "batch_size": 256, "packing_strategy": "simple", "max_packed_len": 8192,
                       "truncation_mode": "keep_start"},
     "output": {"domain_key": null, "storage_format": "bin", "max_tokens_per_shard": 100000000,
                "dtype": {}, "position_ids_mode": "doc_reset"}}

Read here, and refused with a ConfigError naming the field (where AstrAI would go on):
- ``input.sources`` (its DPO / GRPO mode, whose ``.bin`` output its own trainers cannot read): use
  ``--train-type dpo|grpo``;
- ``packing_strategy`` other than ``simple`` and a ``domain_key``: tokenloom writes one record per input
  record into one store (pack at read time with ``PackedSFTDataset``);
- an unknown key, an action other than train / mask / $role (AstrAI masks a misspelt ``"trian"`` silently),
  a mask value other than train / mask. ``batch_size``, ``storage_format`` and ``dtype`` do not change the
  values and are accepted as they are.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any

import orjson

from tokenloom.formats.errors import ConfigError

__all__ = ["AstraiConfig", "AstraiSection", "PositionIds"]

_SECTIONS = {"input", "mask", "mask_default", "preprocessing", "output", "version"}
_PREPROCESSING = {
    "max_seq_len": 2048,
    "min_chars": 50,
    "max_chars": 2_000_000,
    "max_items": None,
    "batch_size": 256,
    "packing_strategy": "simple",
    "max_packed_len": 8192,
    "truncation_mode": "keep_start",
}
_OUTPUT = {
    "domain_key": None,
    "storage_format": "bin",
    "max_tokens_per_shard": 100_000_000,
    "dtype": {},
    "position_ids_mode": "doc_reset",
}
_SECTION_KEYS = {"field", "action", "template", "add_special_tokens"}
_ACTIONS = ("train", "mask", "$role")


class PositionIds(StrEnum):
    """AstrAI's ``position_ids_mode``."""

    NONE = "none"
    DOC_RESET = "doc_reset"
    CONTINUOUS = "continuous"


def _config_error(source: str, problem: str, name: str, hint: str = "Fix the AstrAI pipeline config") -> ConfigError:
    return ConfigError(problem, path=source, field=name, hint=hint)


@dataclass(frozen=True, kw_only=True, slots=True)
class AstraiSection:
    """One ``input.sections`` entry: a record field rendered per message (template) or encoded as text."""

    field: str
    """The JSONL key read."""
    action: str
    """train, mask, or $role (each message's role looked up in the config's ``mask``)."""
    template: bool = False
    """Render each message of the field (a list of messages) through the chat template on its own."""
    add_special_tokens: bool | None = None
    """Encode with the tokenizer's post-processor; None: AstrAI's default (the first non-template section)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AstraiConfig:
    """The parts of AstrAI's ``pipeline.json`` that decide ``sequence``, ``loss_mask`` and ``position_ids``."""

    sections: tuple[AstraiSection, ...]
    """The record's fields in order."""
    mask: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Role -> train | mask, for ``$role`` sections."""
    mask_default: str = "mask"
    """The action of a role ``mask`` does not list."""
    max_seq_len: int = 2048
    """A record's tokens beyond this are cut (AstrAI keeps the start here, whatever ``truncation_mode``)."""
    min_chars: int = 50
    """A text config (no template, every section trained) skips a text shorter than this."""
    max_chars: int = 2_000_000
    """... and longer than this."""
    max_items: int | None = None
    """Stop after this many records kept (None or 0: all)."""
    max_packed_len: int = 8192
    """Each record is then cut to this many tokens by ``truncation_mode`` (AstrAI's ``simple`` packing)."""
    truncation_mode: str = "keep_start"
    """keep_start or keep_end, for the ``max_packed_len`` cut."""
    max_tokens_per_shard: int = 100_000_000
    """Where AstrAI starts a new shard (and continuous position ids start again from 0)."""
    position_ids_mode: PositionIds = PositionIds.DOC_RESET
    """none (no position_ids), doc_reset (from 0 per record) or continuous (across a shard's records)."""
    source: str = "<dict>"
    """Where the config was read from (for messages)."""

    def __post_init__(self) -> None:
        fail = functools.partial(_config_error, self.source)
        if not self.sections:
            raise fail("input.sections is empty or missing: nothing would be read", "input.sections")
        for name in ("max_seq_len", "max_packed_len", "max_tokens_per_shard"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise fail(f"{name} is {value!r}, expected a positive integer", name)
        for name in ("min_chars", "max_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise fail(f"{name} is {value!r}, expected an integer >= 0", name)
        if self.max_items is not None and (isinstance(self.max_items, bool) or not isinstance(self.max_items, int)):
            raise fail(f"max_items is {self.max_items!r}, expected an integer or null", "max_items")
        if self.truncation_mode not in ("keep_start", "keep_end"):
            raise fail(f"truncation_mode {self.truncation_mode!r}, expected keep_start or keep_end", "truncation_mode")
        for role, action in {**self.mask, "<mask_default>": self.mask_default}.items():
            if action not in ("train", "mask"):
                raise fail(f"mask of {role} is {action!r}, expected 'train' or 'mask'", "mask")

    @property
    def has_template(self) -> bool:
        return any(section.template for section in self.sections)

    @property
    def text_config(self) -> bool:
        """AstrAI's pretraining config: no template and every section trained (no loss_mask is written)."""
        return not self.has_template and all(section.action == "train" for section in self.sections)

    @property
    def train_type(self) -> str:
        """The record store's training type: seq for a text config, sft otherwise."""
        return "seq" if self.text_config else "sft"

    def action(self, section: AstraiSection, role: Any) -> str:
        """train or mask for a message of ``role`` in ``section``."""
        if section.action == "$role":
            return self.mask.get(role, self.mask_default) if isinstance(role, str) else self.mask_default
        return section.action

    def settings(self) -> dict[str, Any]:
        """What changes the output, JSON-ready (every field but ``source``, in their order)."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "source"}
        return {
            **values,
            "sections": [asdict(section) for section in self.sections],
            "mask": dict(sorted(self.mask.items())),
            "position_ids_mode": self.position_ids_mode.value,
        }

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> AstraiConfig:
        try:
            data = orjson.loads(Path(path).read_bytes())
        except OSError as exc:
            raise ConfigError(f"cannot read the AstrAI config ({exc.strerror})", path=path) from None
        except orjson.JSONDecodeError as exc:
            raise ConfigError(f"the AstrAI config is not JSON ({exc})", path=path) from None
        return cls.from_dict(data, source=os.fspath(path))

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<dict>") -> AstraiConfig:
        """Read AstrAI's config layout (see the module docstring); unknown keys are ConfigErrors."""

        fail = functools.partial(_config_error, source)

        def part(value: Any, name: str, known: Mapping[str, Any] | set[str]) -> dict[str, Any]:
            if value is None:
                return {}
            if not isinstance(value, dict):
                raise fail(f"{name} is {type(value).__name__}, expected an object", name)
            unknown = sorted(set(value) - set(known))
            if unknown:
                raise fail(f"{name} has unknown keys {unknown}, expected some of {sorted(known)}", name)
            return value

        top = part(data, "the config", _SECTIONS)
        version = top.get("version", 1)
        if version != 1:
            raise fail(f"version {version!r}, expected 1 (AstrAI's only config version)", "version")
        inputs = part(top.get("input"), "input", {"sections", "sources"})
        if inputs.get("sources"):
            raise fail(
                "input.sources (AstrAI's multi-output DPO / GRPO mode) is not read by --astrai-config",
                "input.sources",
                "Use --train-type dpo or --train-type grpo, whose stores keep records and groups (AstrAI's .bin "
                "output of these does not)",
            )
        raw_sections = inputs.get("sections")
        if not isinstance(raw_sections, list) or not raw_sections:
            raise fail("input.sections is missing or empty, expected a list of sections", "input.sections")
        sections = []
        for i, raw in enumerate(raw_sections):
            name = f"input.sections[{i}]"
            raw = part(raw, name, _SECTION_KEYS)
            if not isinstance(raw.get("field"), str) or "action" not in raw:
                raise fail(f"{name} needs a 'field' (text) and an 'action'", name)
            if raw["action"] == "value":
                raise fail(f"{name} has action 'value', which only AstrAI's multi-output mode reads", name)
            if raw["action"] not in _ACTIONS:
                raise fail(f"{name} has action {raw['action']!r}, expected one of {list(_ACTIONS)}", name)
            for flag in ("template", "add_special_tokens"):
                if flag in raw and not isinstance(raw[flag], bool):
                    raise fail(f"{name}.{flag} is {raw[flag]!r}, expected true or false", name)
            sections.append(
                AstraiSection(
                    field=raw["field"],
                    action=raw["action"],
                    template=raw.get("template", False),
                    add_special_tokens=raw.get("add_special_tokens"),
                )
            )
        mask = top.get("mask") or {}
        if not isinstance(mask, dict):
            raise fail(f"mask is {type(mask).__name__}, expected an object of role -> train|mask", "mask")
        pre = {**_PREPROCESSING, **part(top.get("preprocessing"), "preprocessing", _PREPROCESSING)}
        out = {**_OUTPUT, **part(top.get("output"), "output", _OUTPUT)}
        if pre["packing_strategy"] != "simple":
            raise fail(
                f"packing_strategy {pre['packing_strategy']!r}: tokenloom writes one record per conversation",
                "preprocessing.packing_strategy",
                "Set it to 'simple' and pack at read time (tokenloom.datasets.PackedSFTDataset: best-fit decreasing, "
                "position ids reset per conversation)",
            )
        if out["domain_key"] is not None:
            raise fail(
                "domain_key splits AstrAI's output by domain; tokenloom writes one store",
                "output.domain_key",
                "Drop domain_key and run once per domain (or mix the stores with a curriculum)",
            )
        try:
            positions = PositionIds(out["position_ids_mode"])
        except ValueError:
            raise fail(
                f"position_ids_mode {out['position_ids_mode']!r}, expected one of {[p.value for p in PositionIds]}",
                "output.position_ids_mode",
            ) from None
        values = {**pre, **out, "position_ids_mode": positions}  # the fields named as in AstrAI's sections
        return cls(
            sections=tuple(sections),
            mask=MappingProxyType(dict(mask)),
            mask_default=top.get("mask_default", "mask"),
            source=source,
            **{f.name: values[f.name] for f in fields(cls) if f.name in values},
        )
