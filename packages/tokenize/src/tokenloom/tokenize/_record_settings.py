"""--train-type settings of a tokenize run: checked up front, and those that change the record store.

``config`` is a ``TokenizeConfig``, typed ``Any`` here: ``_config`` imports this module, not the reverse.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenloom.formats import ConfigError, FormatSpec, available_formats
from tokenloom.tokenize.windowing import Windowing, member

__all__ = ["TRAIN_TYPES", "RecordOptions", "check_post_training", "record_format_at", "record_formats"]

#: --train-type values: post-training records instead of text (tokenloom.tokenize.chat).
TRAIN_TYPES = ("sft", "dpo", "grpo")


def _record_specs() -> dict[str, FormatSpec]:
    """The output formats of post-training records (--train-type), asked of the format registry: the writable
    formats with a keyed-store side; first the one a grouped record store (``open_records``) opens under, the
    default."""
    from tokenloom.formats.keyed import RECORD_FORMATS as GROUPED

    specs = {
        name: spec for name, spec in available_formats().items() if spec.store is not None and spec.writer is not None
    }
    return dict(sorted(specs.items(), key=lambda item: item[0] not in GROUPED))


def record_formats() -> tuple[str, ...]:
    """The --format names a --train-type run writes (the default first)."""
    return tuple(_record_specs())


def record_format_at(out: Path) -> str:
    """The record format whose store is published at ``out`` (each spec's detector asked at its output path);
    the default while nothing is published there."""
    found = [name for name, spec in _record_specs().items() if spec.detect(spec.output_path(out))]
    return found[0] if len(found) == 1 else record_formats()[0]


def check_post_training(config: Any) -> None:
    """--train-type: the record settings, and the text-only options refused."""
    from tokenloom.tokenize.chat import Truncate  # loaded here: a text run never imports chat
    from tokenloom.tokenize.chat._encode import check_roles

    if config.train_type not in TRAIN_TYPES and not (config.train_type == "seq" and config.astrai_config):
        raise ConfigError(f"train_type {config.train_type!r}, expected one of {list(TRAIN_TYPES)}", field="train_type")
    if getattr(available_formats().get(config.format), "unit_shards", False):  # the default: a record store
        object.__setattr__(config, "format", record_formats()[0])
    if config.format not in _record_specs():
        raise ConfigError(
            f"format {config.format!r} with --train-type {config.train_type}; post-training records are written as a "
            f"record store, one of {list(record_formats())}",
            field="format",
            hint="Drop --format (bin-meta is the default), or convert the store afterwards",
        )
    if config.chat_template is not None:
        object.__setattr__(config, "chat_template", Path(config.chat_template))
        if not config.chat_template.is_file():
            raise ConfigError("the chat template file does not exist", path=config.chat_template, field="chat_template")
    object.__setattr__(config, "train_roles", tuple(config.train_roles))
    if config.astrai_config is not None:
        _check_astrai(config)
    check_roles(config.train_roles, config.seq_len)
    member(Truncate, config.truncate, "truncate")
    for name, value in (("overlap_size", config.overlap_size), ("min_text_length", config.min_text_length)):
        if value:
            raise ConfigError(f"{name} is {value}, but it applies to text, not to --train-type records", field=name)
    if config.windowing is not Windowing.TOKENLOOM or config.many_datasets:
        raise ConfigError(
            "--train-type runs do not take --windowing, --layout tree or --val-fraction",
            field="train_type",
            hint="Drop those options (one record store per run)",
        )


def _check_astrai(config: Any) -> None:
    """--astrai-config: the config read (a ConfigError naming its field), its training type, the options it owns."""
    from tokenloom.tokenize.chat import AstraiConfig

    object.__setattr__(config, "astrai_config", Path(config.astrai_config))  # type: ignore[arg-type]
    astrai = AstraiConfig.from_file(config.astrai_config)  # type: ignore[arg-type]
    if config.train_type not in ("sft", astrai.train_type):
        raise ConfigError(
            f"--astrai-config with --train-type {config.train_type}: AstrAI's sft and pretrain configs are read",
            field="astrai_config",
            hint="Drop --train-type (or pass sft); for dpo and grpo use --train-type without --astrai-config",
        )
    owned = {"train_roles": config.train_roles != ("assistant",), "seq_len": config.seq_len is not None}
    owned["truncate"] = config.truncate != "skip"
    for name, given in owned.items():
        if given:
            raise ConfigError(
                f"{name} with --astrai-config: the AstrAI config decides it (mask, max_seq_len, truncation_mode)",
                field=name,
                hint=f"Drop --{name.replace('_', '-')} and set it in the AstrAI config",
            )
    if astrai.position_ids_mode.value == "continuous" or astrai.max_items:
        raise ConfigError(
            "position_ids_mode continuous and max_items count across the whole input, which a unit-planned run "
            "does not see in one process",
            path=config.astrai_config,
            field="output.position_ids_mode" if astrai.max_items is None else "preprocessing.max_items",
            hint="Use doc_reset and no max_items, or tokenloom.tokenize.chat.records_from_astrai_config in one process",
        )
    object.__setattr__(config, "train_type", astrai.train_type)


@dataclass(frozen=True, kw_only=True, slots=True)
class RecordOptions:
    """What the post-training modules take of a --train-type run, made once where the run is planned
    (``TokenizeConfig.record_options``): the record transform's settings, not the whole config."""

    train_type: str | None
    format: str
    chat_template: Path | None
    train_roles: tuple[str, ...]
    seq_len: int | None
    truncate: str
    on_error: str
    """raise or skip (an ``OnError``): what a bad record does."""
    max_line_bytes: int
    astrai_config: Path | None

    def settings(self) -> dict[str, Any]:
        """The settings that change the record store (in the plan's run key)."""
        template = None
        if self.chat_template is not None:
            template = _sha256_file(self.chat_template)
        return {
            "train_type": self.train_type,
            "format": self.format,
            "chat_template_sha256": template,
            "train_roles": list(self.train_roles),
            "max_length": self.seq_len,  # recorded key: earlier run keys resume
            "truncate": self.truncate,
            "on_error": str(self.on_error),
            "max_line_bytes": self.max_line_bytes,
            **({"astrai_config_sha256": _sha256_file(self.astrai_config)} if self.astrai_config else {}),
        }


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
