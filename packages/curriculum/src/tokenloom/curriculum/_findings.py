"""The validation findings of a curriculum config: what blocks, what warns, what is only said.

Exit codes as GPT-Simple's validator: 0 clean, 2 warnings only, 1 anything blocking.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from tokenloom.curriculum._buckets import discover_buckets, is_empty_dir
from tokenloom.curriculum._config import CurriculumConfig, ExhaustionPolicy
from tokenloom.curriculum._drains import drain_verdicts
from tokenloom.curriculum._plan import CurriculumPlan, build_plan
from tokenloom.curriculum._remote_dir import RemoteDir
from tokenloom.formats import DataError

if TYPE_CHECKING:  # the dataset imports torch: only findings() asks for it, validate() plans without
    from tokenloom.curriculum._dataset import CurriculumDataset

__all__ = ["Finding", "exit_code", "findings", "validate"]

_Plan = TypeVar("_Plan", bound=CurriculumPlan)


@dataclass(frozen=True, slots=True)
class Finding:
    severity: str
    """"error" (blocking), "warning" or "info"."""
    code: str
    message: str


def _structure(config: CurriculumConfig) -> list[Finding]:
    """Problems with the bucket directories, all of them (not just the first)."""
    out: list[Finding] = []
    try:
        names = discover_buckets(config.path, source=config.source)
    except DataError as exc:
        return [Finding("error", "buckets.missing", f"{type(exc).__name__}: {exc}")]
    named = config.buckets_named() if config.curriculum is not None else set(names)
    for name in names:
        if name not in named and is_empty_dir(config.path / "train" / name):
            out.append(
                Finding(
                    "warning",
                    f"bucket.{name}.unused_empty",
                    f"bucket {name!r} is empty and no phase uses it: skipped ({config.path / 'train' / name})",
                )
            )
            continue
        for split in ("train", "val"):
            directory = config.path / split / name
            if not directory.is_dir():
                out.append(Finding("error", f"bucket.{name}.{split}.missing", f"val twin missing: {directory}"))
            elif is_empty_dir(directory):
                out.append(Finding("error", f"bucket.{name}.{split}.empty", f"empty bucket directory: {directory}"))
    unknown = sorted(config.buckets_named() - set(names))
    if unknown:
        phases = sorted(
            i for i, p in enumerate(config.curriculum or ()) if set(p.mix) & set(unknown)
        )  # where the names are used
        out.append(
            Finding(
                "error",
                "curriculum.unknown_buckets",
                f"the mix of phase(s) {phases} in {config.source or 'the config'} names buckets {unknown} that are "
                f"not under {config.path / 'train'} (found {names}): fix the names in the mix or add the directories",
            )
        )
    if config.curriculum is not None:
        unused = sorted(set(names) - {n for p in config.curriculum for n, w in p.mix.items() if w > 0})
        if unused:
            out.append(Finding("warning", "curriculum.unused_buckets", f"buckets never used by any phase: {unused}"))
    return out


def findings(config: CurriculumConfig, **options: Any) -> tuple[list[Finding], CurriculumDataset | None]:
    """Every finding for ``config`` (``options``: those of :func:`_findings`); the dataset when it could be built."""
    from tokenloom.curriculum._dataset import CurriculumDataset

    return _findings(CurriculumDataset, config, **options)


def _findings(
    kind: type[_Plan],
    config: CurriculumConfig,
    *,
    seed: int = 0,
    global_batch_size: int | None = None,
    max_steps: int | None = None,
    plan_cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[list[Finding], _Plan | None]:
    """Every finding for ``config``; the plan (a :class:`CurriculumPlan` or the dataset) when it could be built."""
    out = _structure(config)
    if any(f.severity == "error" for f in out):
        return out, None
    try:
        ds = kind(config, seed=seed, global_batch_size=global_batch_size, plan_cache_dir=plan_cache_dir)
        for name in ds.buckets:
            ds.val_dataset(name)
    except DataError as exc:
        return [*out, Finding("error", "dataset", f"{type(exc).__name__}: {exc}")], None
    schedule = ds.schedule
    out.extend(Finding(*verdict) for verdict in drain_verdicts(ds))
    if schedule.ended_early:
        severity = "warning" if ds.policy is ExhaustionPolicy.RENORMALISE else "error"
        out.append(Finding(severity, "curriculum.ended_early", f"the curriculum ends early: {schedule.ended_early}"))
    if global_batch_size is not None and max_steps is not None:
        out.extend(_budget(ds, global_batch_size, max_steps))
    out.extend(_order_hints(ds))
    return out, ds


def _order_hints(ds: CurriculumPlan) -> list[Finding]:
    """Buckets in object storage, read in part in the Feistel order: their draws touch every block."""
    if not isinstance(ds.config.path, RemoteDir) or not ds.shuffle:
        return []
    partial = []
    for b, name in enumerate(ds.buckets):
        samples, drawn = ds.schedule.bucket_samples[b], int(ds.schedule.drawn[b])
        if ds.orders[b] is None and samples and drawn < samples // 2:
            partial.append(f"{name} ({drawn / samples:.0%})")
    if not partial:
        return []
    return [
        Finding(
            "info",
            "data.order",
            f"buckets read in part from object storage in the feistel order: {', '.join(partial)} of their samples; "
            "their draws touch every block, so a node fetches about all of each bucket. order: block reads the "
            "blocks the curriculum uses (see the curriculum README, 'Block order')",
        )
    ]


def _budget(ds: CurriculumPlan, global_batch_size: int, max_steps: int) -> list[Finding]:
    planned = len(ds)
    steps = planned // global_batch_size
    if max_steps == steps:
        left = planned - steps * global_batch_size
        note = f" ({left} samples past the last full step are not read)" if left else ""
        return [Finding("info", "training.budget", f"{max_steps} steps x {global_batch_size} = the curriculum{note}")]
    loop_samples = max_steps * global_batch_size
    loop_tokens = ds.schedule.tokens_before(min(loop_samples, planned))
    direction = "more" if loop_samples > planned else "fewer"
    text = (
        f"the loop reads {loop_samples:,} samples ({max_steps} steps x global batch {global_batch_size}), "
        f"{direction} than the curriculum's {planned:,} samples ({ds.schedule.total_tokens:,} budget tokens; "
        f"the loop's first {min(loop_samples, planned):,} samples hold {loop_tokens:,}); "
        f"max_steps should be {steps}"
    )
    severity = "warning" if ds.config.allow_budget_mismatch else "error"
    return [Finding(severity, "training.budget_mismatch", text)]


def exit_code(found: list[Finding]) -> int:
    if any(f.severity == "error" for f in found):
        return 1
    return 2 if any(f.severity == "warning" for f in found) else 0


def validate(config_path: str | os.PathLike[str], **options: Any) -> tuple[int, list[Finding], dict[str, Any] | None]:
    """(exit code, findings, plan or None) for a config file."""
    try:
        config = CurriculumConfig.from_file(config_path)
    except DataError as exc:
        found = [Finding("error", "config", f"{type(exc).__name__}: {exc}")]
        return 1, found, None
    found, plan = _findings(CurriculumPlan, config, **options)  # the plan only: no torch
    return exit_code(found), found, build_plan(plan) if plan is not None else None
