"""CurriculumConfig: GPT-Simple's ``data:`` block as it is, plus TOML and a Python API.

Accepted files: a whole GPT-Simple config (``model``/``data``/``optimizer``/``training``;
only ``data`` is read), or the data block itself at the top level; YAML (``.yaml``,
``.yml``), TOML (``.toml``) or JSON. Every key of GPT-Simple's DataConfig is
accepted; ``tokenizer``, ``overlap_size`` and ``num_workers`` are recorded and not
used here (they belong to tokenization and the loader). tokenloom adds
``bucket_exhaustion`` (halt | renormalise | repeat), ``max_repetition`` and
``budget_unit`` (input_tokens | loss_tokens: what a phase's ``duration_tokens`` counts), ``eos_id``
(for loss_tokens over data that declares no EOS id, GPT-Simple's own output: GPT-Simple takes it from its
tokenizer, and so does this config when ``tokenizer`` is a local directory) and
``order`` (feistel | block, for every bucket or per bucket) with ``block_samples``/``window_blocks``:
the order of each bucket's draws (block: reads in runs, for buckets in object storage).

``path`` may be a URL (``s3://bucket/data``, ``gs://``, ``az://``): the buckets are read from object
storage with ``storage_options`` (the store's options; credentials are better left to the environment:
AWS_*, GOOGLE_*, AZURE_*) into the node-local ``block_cache_dir`` (default ``$TOKENLOOM_CACHE_DIR``); the
file's two keys become one ``RemoteOptions``, the Python API's ``remote``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import numbers
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from tokenloom.curriculum._eos import config_eos_id
from tokenloom.curriculum._order import BucketOrder, check_order, parse_choice, resolve_order
from tokenloom.curriculum._remote_dir import RemoteDir, as_data_root
from tokenloom.formats import ConfigError, MissingFileError, RemoteOptions
from tokenloom.formats.io import is_remote_url

__all__ = ["BudgetUnit", "CurriculumConfig", "ExhaustionPolicy", "Phase"]

_SEED_KEYS = {
    "path",
    "tokenizer",
    "format",
    "max_length",  # GPT-Simple's name of seq_len
    "overlap_size",
    "packing",
    "num_workers",
    "curriculum",
    "allow_bucket_exhaustion",
    "allow_budget_mismatch",
}
_OUR_KEYS = {
    "seq_len",
    "bucket_exhaustion",
    "max_repetition",
    "budget_unit",
    "storage_options",
    "block_cache_dir",
    "eos_id",
    "order",
    "block_samples",
    "window_blocks",
}
_DATA_KEYS = _SEED_KEYS | _OUR_KEYS
_SECTIONS = {"model", "data", "optimizer", "training"}
_PHASE_KEYS = {"duration_tokens", "mix"}


class ExhaustionPolicy(StrEnum):
    """What happens at the position where a bucket runs dry (known before step 0)."""

    HALT = "halt"
    """Stop there: BucketExhausted, run status ``halted`` (GPT-Simple's allow_bucket_exhaustion: false)."""
    RENORMALISE = "renormalise"
    """Drop the bucket, renormalise the rest of the phase's weights (allow_bucket_exhaustion: true)."""
    REPEAT = "repeat"
    """Re-read the bucket, a new permutation per epoch, up to ``max_repetition`` epochs; then halt."""


class BudgetUnit(StrEnum):
    """What a phase's ``duration_tokens`` counts, per emitted sample."""

    INPUT_TOKENS = "input_tokens"
    """The non-padding tokens of the sample's input_ids (tokenloom's default)."""
    LOSS_TOKENS = "loss_tokens"
    """GPT-Simple's unit (its ``_train_loop.py`` counts ``(labels != -100).sum()`` of its unshifted labels):
    the non-padding input tokens minus the first token after every EOS and minus overlap-prefix tokens."""

    @property
    def description(self) -> str:
        if self is BudgetUnit.LOSS_TOKENS:
            return (
                "loss_tokens: non-padding input tokens minus the token after each EOS and overlap-prefix "
                "tokens (GPT-Simple's count)"
            )
        return "input_tokens: non-padding tokens of emitted samples' input_ids"


@dataclass(frozen=True, kw_only=True, slots=True)
class Phase:
    """One phase: a token budget and the token weights of the buckets."""

    duration_tokens: int
    """Budget tokens of the phase (non-padding tokens of the samples it emits)."""
    mix: Mapping[str, float]
    """Bucket -> weight, normalised to sum 1 (as GPT-Simple does)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "duration_tokens", _duration(self.duration_tokens, "duration_tokens"))
        object.__setattr__(self, "mix", _normalised(self.mix, "mix"))


@dataclass(frozen=True, kw_only=True, slots=True)
class CurriculumConfig:
    """A curriculum over the buckets under ``path/train``; see the package README."""

    path: Path | RemoteDir
    """Data root holding ``train/<bucket>/`` and ``val/<bucket>/``: a directory or a URL (``s3://...``)."""
    seq_len: int = 2048
    """Tokens per sample (L)."""
    packing: bool = True
    """True: whole documents bin-packed into L tokens; False: fixed windows of L tokens."""
    curriculum: tuple[Phase, ...] | None = None
    """The phases; None: one phase reading every bucket once, weights proportional to their tokens."""
    allow_bucket_exhaustion: bool = False
    """GPT-Simple's switch: False halts where a bucket runs dry, True renormalises."""
    allow_budget_mismatch: bool = False
    """A curriculum total that differs from what the loop consumes is a warning, not an error."""
    bucket_exhaustion: ExhaustionPolicy | str | None = None
    """Overrides ``allow_bucket_exhaustion``; ``repeat`` needs ``max_repetition`` >= 2."""
    max_repetition: int = 1
    """Epochs a bucket may be read (repeat policy)."""
    budget_unit: BudgetUnit | str = BudgetUnit.INPUT_TOKENS
    """What ``duration_tokens`` counts: ``input_tokens`` (default) or ``loss_tokens`` (GPT-Simple's unit)."""
    tokenizer: str | None = None
    """Recorded only (GPT-Simple's key)."""
    format: str = "pretokenized"
    """GPT-Simple's key; only ``pretokenized`` has buckets of token shards."""
    overlap_size: int | None = None
    """Recorded only (GPT-Simple's tokenization setting)."""
    num_workers: int | None = None
    """Recorded only (GPT-Simple's loader setting)."""
    order: BucketOrder | str | Mapping[str, BucketOrder | str] = BucketOrder.FEISTEL
    """Every bucket's draw order (``feistel`` or ``block``), or a mapping bucket -> order (others: feistel)."""
    block_samples: int | None = None
    """order block: consecutive samples per block (default: the sampler's 16,384, 64 MiB of 2,049-token uint16
    windows); size it to span several of the cache's blocks (fetched / used ~ 1 + 1 / cache blocks spanned)."""
    window_blocks: int | None = None
    """order block: blocks shuffled together (default: the sampler's 8); a bucket's draws touch one window
    at a time, so its fetched bytes are its draws rounded up to whole windows."""
    remote: RemoteOptions | None = field(default=None, repr=False, compare=False)
    """For a URL ``path``: the store's options and the node-local block cache (a file's ``storage_options`` and
    ``block_cache_dir``); None: the environment's and ``$TOKENLOOM_CACHE_DIR``."""
    eos_id: int | None = None
    """The data's EOS id where its shards declare none (loss_tokens needs it); None: the shards', else the
    local ``tokenizer``'s."""
    source: str | None = field(default=None, compare=False)
    """The file this came from, for messages."""

    def __post_init__(self) -> None:
        where = self.source
        if self.remote is not None and not isinstance(self.remote, RemoteOptions):
            raise ConfigError(f"remote is a {type(self.remote).__name__}, expected a RemoteOptions", field="remote")
        remote = is_remote_url(self.path) or isinstance(self.path, RemoteDir)
        if not remote and self.remote is not None:
            raise ConfigError(
                f"remote (storage_options, block_cache_dir) is set but data.path {os.fspath(self.path)!r} is a "
                "local directory",
                path=where,
                field="remote",
                hint="storage_options and block_cache_dir apply to a path in object storage (s3://, gs://, az://)",
            )
        object.__setattr__(self, "path", as_data_root(self.path, self.remote))
        object.__setattr__(self, "seq_len", _positive_int(self.seq_len, "seq_len", where))
        for name in ("packing", "allow_bucket_exhaustion", "allow_budget_mismatch"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} is {getattr(self, name)!r}, expected true or false", path=where, field=name)
        if self.format != "pretokenized":
            raise ConfigError(
                f"format is {self.format!r}: curriculum buckets are token shards",
                path=where,
                field="format",
                hint="Tokenize first (tokenloom tokenize) and set format: pretokenized",
            )
        if self.curriculum is not None:
            phases = tuple(self.curriculum)
            if not phases:
                raise ConfigError(
                    "curriculum is an empty list", path=where, field="curriculum", hint="Omit it for one phase"
                )
            object.__setattr__(self, "curriculum", phases)
        object.__setattr__(self, "max_repetition", _positive_int(self.max_repetition, "max_repetition", where))
        object.__setattr__(self, "eos_id", config_eos_id(self.eos_id, self.tokenizer, where))
        budget_hint = "loss_tokens counts phase budgets as GPT-Simple does; input_tokens is tokenloom's default"
        object.__setattr__(
            self, "budget_unit", parse_choice(BudgetUnit, self.budget_unit, "budget_unit", where, budget_hint)
        )
        self._check_order(where)
        if self.bucket_exhaustion is not None:
            policy = parse_choice(ExhaustionPolicy, self.bucket_exhaustion, "bucket_exhaustion", where)
            object.__setattr__(self, "bucket_exhaustion", policy)
        if self.policy is ExhaustionPolicy.REPEAT and self.max_repetition < 2:
            raise ConfigError(
                "bucket_exhaustion is repeat but max_repetition is 1",
                path=where,
                field="max_repetition",
                hint="Set max_repetition to the epochs a bucket may be read (>= 2)",
            )
        if self.policy is not ExhaustionPolicy.REPEAT and self.max_repetition != 1:
            raise ConfigError(
                f"max_repetition is {self.max_repetition} but the policy is {self.policy.value}",
                path=where,
                field="max_repetition",
                hint="Set bucket_exhaustion: repeat to re-read buckets",
            )

    def _check_order(self, where: str | None) -> None:
        order, block_samples, window_blocks = check_order(self.order, self.block_samples, self.window_blocks, where)
        object.__setattr__(self, "order", order)
        object.__setattr__(self, "block_samples", block_samples)
        object.__setattr__(self, "window_blocks", window_blocks)

    def bucket_order(self, bucket: str) -> tuple[int, int] | None:
        """The schedule's order of ``bucket``: None (feistel) or (block_samples, window_blocks)."""
        return resolve_order(self.order, self.block_samples, self.window_blocks, bucket)

    @property
    def policy(self) -> ExhaustionPolicy:
        if self.bucket_exhaustion is not None:
            return ExhaustionPolicy(self.bucket_exhaustion)
        return ExhaustionPolicy.RENORMALISE if self.allow_bucket_exhaustion else ExhaustionPolicy.HALT

    @property
    def unit(self) -> BudgetUnit:
        return BudgetUnit(self.budget_unit)

    @property
    def max_epochs(self) -> int:
        return self.max_repetition if self.policy is ExhaustionPolicy.REPEAT else 1

    def buckets_named(self) -> set[str]:
        return {name for phase in self.curriculum or () for name in phase.mix}

    def schedule_fingerprint(self) -> str:
        """Everything about the config that places samples before the first drain (no policy, no path)."""
        phases = None
        if self.curriculum is not None:
            phases = [[p.duration_tokens, sorted(p.mix.items())] for p in self.curriculum]
        payload: dict[str, Any] = {"max_length": self.seq_len, "packing": self.packing, "curriculum": phases}
        if self.unit is not BudgetUnit.INPUT_TOKENS:  # the default leaves fingerprints of earlier states unchanged
            payload["budget_unit"] = self.unit.value
            if self.eos_id is not None:  # it decides which tokens count
                payload["eos_id"] = self.eos_id
        # the order is not here: the plan's identity holds each bucket's order as resolved (defaults filled in),
        # so spelling out a default (block_samples: 16384, order: {web: feistel}) still resumes
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def replace(self, **changes: Any) -> CurriculumConfig:
        return dataclasses.replace(self, **changes)

    # -- loading ------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], *, source: str | None = None) -> CurriculumConfig:
        """From a whole GPT-Simple config (its ``data`` section) or a data block."""
        if not isinstance(raw, Mapping):
            raise ConfigError(f"the config is a {type(raw).__name__}, expected a mapping", path=source)
        if "data" in raw and isinstance(raw["data"], Mapping):
            _refuse_unknown(raw, _SECTIONS, "top-level keys {}; a GPT-Simple config has {}", source)
            raw = raw["data"]
        _refuse_unknown(raw, _DATA_KEYS, "keys {} in the data block; valid keys: {}", source)
        if "path" not in raw:
            raise ConfigError("the data block has no 'path'", path=source, field="path")
        values = dict(raw)
        if "max_length" in values:
            if "seq_len" in values:
                raise ConfigError(
                    "the data block has both seq_len and max_length (GPT-Simple's name of seq_len)",
                    path=source,
                    field="seq_len",
                    hint="Keep one of them",
                )
            values["seq_len"] = values.pop("max_length")
        phases = values.pop("curriculum", None)
        if phases is not None:
            if not isinstance(phases, list):
                raise ConfigError(
                    f"curriculum is a {type(phases).__name__}, expected a list of phases",
                    path=source,
                    field="curriculum",
                )
            values["curriculum"] = tuple(_phase(p, i, source) for i, p in enumerate(phases))
        if is_remote_url(values["path"]):
            values["path"] = str(values["path"])  # a URL is never relative to the config file
        else:
            path = Path(str(values["path"]))
            if source is not None and not path.is_absolute():
                path = Path(source).parent / path
            values["path"] = path
        if "storage_options" in values or "block_cache_dir" in values:
            values["remote"] = _remote_of(
                values.pop("storage_options", None), values.pop("block_cache_dir", None), source
            )
        return cls(**values, source=source)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> CurriculumConfig:
        """YAML (.yaml/.yml), TOML (.toml) or JSON; relative data paths are relative to the file."""
        file = Path(path)
        if not file.is_file():
            raise MissingFileError(f"config file {file} does not exist", path=file)
        try:
            text = file.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"the config is not UTF-8 text (byte {exc.object[exc.start]:#04x} at byte offset {exc.start})",
                path=file,
                offset=exc.start,
                hint="Save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)",
            ) from None
        suffix = file.suffix.lower()
        try:
            if suffix in (".yaml", ".yml"):
                import yaml

                raw = yaml.safe_load(text) or {}
            elif suffix == ".toml":
                raw = tomllib.loads(text)
            elif suffix == ".json":
                raw = json.loads(text)
            else:
                raise ConfigError(
                    f"config suffix {suffix!r}, expected .yaml, .yml, .toml or .json", path=file, field="suffix"
                )
        except ConfigError:
            raise
        except Exception as exc:  # yaml.YAMLError, tomllib.TOMLDecodeError, json.JSONDecodeError
            raise ConfigError(
                f"cannot parse the config: {_one_line(exc)}",
                path=file,
                hint=f"Fix the {suffix.lstrip('.').upper()} syntax at that line",
            ) from None
        return cls.from_dict(raw, source=str(file))


def _refuse_unknown(raw: Mapping[str, Any], valid: set[str], what: str, source: str | None) -> None:
    """ConfigError naming the keys of ``raw`` outside ``valid`` (``what``: the message after "unknown ")."""
    unknown = sorted(set(raw) - valid)
    if unknown:
        raise ConfigError(
            "unknown " + what.format(unknown, sorted(valid)),
            path=source,
            field=unknown[0],
            hint="Check the spelling (GPT-Simple's DataConfig names)",
        )


def _one_line(exc: Exception) -> str:
    """A parser's message on one line, with the line and column it names (YAML's marks are 0-based)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is not None and problem:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(exc).split())


def _phase(raw: object, index: int, source: str | None) -> Phase:
    where = f"curriculum[{index}]"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} is {raw!r}, expected a mapping with duration_tokens and mix", path=source)
    unknown = sorted(set(raw) - _PHASE_KEYS)
    missing = sorted(_PHASE_KEYS - set(raw))
    if unknown or missing:
        problem = f"unknown keys {unknown}" if unknown else f"missing {missing}"
        raise ConfigError(
            f"{where} has {problem}; a phase has exactly {sorted(_PHASE_KEYS)}",
            path=source,
            field=f"{where}.{(unknown or missing)[0]}",
        )
    return Phase(
        duration_tokens=_duration(raw["duration_tokens"], f"{where}.duration_tokens", source),
        mix=_normalised(raw["mix"], f"{where}.mix", source),
    )


def _positive_int(value: object, name: str, source: str | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
        raise ConfigError(f"{name} is {value!r}, expected an integer >= 1", path=source, field=name)
    return int(value)


def _duration(value: object, name: str, source: str | None = None) -> int:
    if isinstance(value, str | float):
        string = isinstance(value, str)
        raise ConfigError(
            f"{name} is the {'string' if string else 'float'} {value!r}, expected an integer number of tokens",
            path=source,
            field=name,
            hint="YAML reads 5e9 as a string: write 5000000000 (or 5_000_000_000)"
            if string
            else "Write the token count as an integer, e.g. 5000000000",
        )
    return _positive_int(value, name, source)


def _normalised(mix: object, name: str, source: str | None = None) -> dict[str, float]:
    if not isinstance(mix, Mapping) or not mix:
        raise ConfigError(f"{name} is {mix!r}, expected a non-empty mapping bucket -> weight", path=source, field=name)
    weights: dict[str, float] = {}
    for bucket, weight in mix.items():
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
            raise ConfigError(
                f"{name}[{bucket!r}] is {weight!r}, expected a number", path=source, field=f"{name}.{bucket}"
            )
        weight = float(weight)
        if math.isnan(weight) or math.isinf(weight) or weight < 0:
            raise ConfigError(
                f"{name}[{bucket!r}] is {weight!r}, expected a finite weight >= 0",
                path=source,
                field=f"{name}.{bucket}",
            )
        weights[str(bucket)] = weight
    total = sum(weights.values())
    if total <= 0:
        raise ConfigError(
            f"every weight of {name} is zero", path=source, field=name, hint="Give at least one bucket a weight > 0"
        )
    return {bucket: weight / total for bucket, weight in weights.items()}


def _remote_of(storage_options: Any, block_cache_dir: Any, source: str | None) -> RemoteOptions:
    """A file's ``storage_options`` and ``block_cache_dir`` (relative to the file, as ``path``) as one value."""
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise ConfigError(
            f"storage_options is a {type(storage_options).__name__}, expected a mapping",
            path=source,
            field="storage_options",
        )
    if block_cache_dir is not None:
        if not isinstance(block_cache_dir, str) or is_remote_url(block_cache_dir):
            raise ConfigError(
                f"block_cache_dir is {block_cache_dir!r}, expected a local directory",
                path=source,
                field="block_cache_dir",
                hint="The cache of remote blocks must be on this node (a local disk or NVMe)",
            )
        if source is not None and not Path(block_cache_dir).is_absolute():
            block_cache_dir = str(Path(source).parent / block_cache_dir)
    return RemoteOptions.from_keywords(storage_options=storage_options, block_cache_dir=block_cache_dir)
