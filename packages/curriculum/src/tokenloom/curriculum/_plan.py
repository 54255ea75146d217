"""The plan (everything the schedule decides, before step 0) and the validation findings.

Exit codes as GPT-Simple's validator: 0 clean, 2 warnings only, 1 anything blocking.
A config that validates clean has no drain and no budget mismatch, so it never
halts at runtime: the halt position is part of this same plan.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokenloom.curriculum._buckets import discover_buckets, is_empty_dir
from tokenloom.curriculum._config import CurriculumConfig, ExhaustionPolicy
from tokenloom.curriculum._dataset import CurriculumDataset, drain_effect
from tokenloom.formats import DataError
from tokenloom.formats.io import require

__all__ = ["Finding", "build_plan", "exit_code", "findings", "plot_plan", "validate"]


@dataclass(frozen=True, slots=True)
class Finding:
    severity: str
    """"error" (blocking), "warning" or "info"."""
    code: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"severity": self.severity, "code": self.code, "message": self.message}


def build_plan(ds: CurriculumDataset) -> dict[str, Any]:
    """Phases (start/end sample, tokens), per-bucket inventory and demand, drains, segments."""
    schedule = ds.schedule
    names = ds.buckets
    phases = []
    mixes = (
        [dict(p.mix) for p in ds.config.curriculum]
        if ds.config.curriculum is not None
        else [dict(zip(names, schedule.weights[0].tolist(), strict=True))]
    )
    for index, ((start, end), tokens) in enumerate(zip(schedule.phase_bounds, schedule.phase_tokens, strict=True)):
        before, after = schedule.counts_before(start), schedule.counts_before(end)
        draws = (after - before).tolist()
        phases.append(
            {
                "index": index,
                "start_sample": start,
                "end_sample": end,
                "samples": end - start,
                "target_tokens": ds.phase_budgets[index],
                "tokens": tokens,
                "mix": mixes[index],
                "demand_samples": {n: d for n, d in zip(names, draws, strict=True) if d},
                "demand_tokens": {
                    n: _tokens(schedule, b, int(after[b])) - _tokens(schedule, b, int(before[b]))
                    for b, n in enumerate(names)
                    if draws[b]
                },
            }
        )
    drains = [
        {
            "bucket": names[d.bucket],
            "sample": d.position,
            "token": d.tokens,
            "phase": d.phase,
            "epochs": d.epochs,
            "effect": drain_effect(d, ds.halt),
        }
        for d in schedule.drains
    ]
    buckets = []
    for b, bucket in enumerate(ds._buckets):
        buckets.append(
            {
                "name": bucket.name,
                "samples": bucket.samples,
                "budget_tokens": bucket.budget_tokens,
                "disk_tokens": bucket.disk_tokens,
                "entries": bucket.entries,
                "shards": bucket.shards,
                "epochs_allowed": ds.config.max_epochs,
                "demand_samples": int(schedule.drawn[b]),
                "demand_tokens": _tokens(schedule, b, int(schedule.drawn[b])),
            }
        )
    return {
        "config": ds.config.source,
        "seed": ds.seed,
        "policy": ds.policy.value,
        "max_length": ds.config.max_length,
        "packing": ds.config.packing,
        "budget_unit": ds.config.unit.value,
        "budget_unit_definition": ds.config.unit.description,
        "samples": len(ds),
        "tokens": schedule.total_tokens,
        "halt_sample": ds.halt_position if ds.halt is not None else None,
        "halt_step": ds.halt_step(),
        "ended_early": schedule.ended_early,
        "discrepancy_samples": round(schedule.discrepancy(), 4),
        "buckets": buckets,
        "phases": phases,
        "drains": drains,
        "segments": [
            {
                "phase": s.phase,
                "start_sample": s.start,
                "end_sample": s.end,
                "start_token": schedule.tokens_before(s.start),
                "end_token": schedule.tokens_before(s.end),
                "weights": {n: w for n, w in zip(names, s.weights, strict=True) if w > 0},
            }
            for s in schedule.segments
        ],
    }


def _tokens(schedule: Any, bucket: int, draws: int) -> int:
    samples = schedule.bucket_samples[bucket]
    return (draws * schedule.bucket_tokens[bucket]) // samples if samples else 0


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


def findings(
    config: CurriculumConfig,
    *,
    seed: int = 0,
    global_batch_size: int | None = None,
    max_steps: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[list[Finding], CurriculumDataset | None]:
    """Every finding for ``config``; the dataset when it could be built."""
    out = _structure(config)
    if any(f.severity == "error" for f in out):
        return out, None
    try:
        ds = CurriculumDataset(config, seed=seed, global_batch_size=global_batch_size, cache_dir=cache_dir)
        for name in ds.buckets:
            ds.val_dataset(name)
    except DataError as exc:
        return [*out, Finding("error", "dataset", f"{type(exc).__name__}: {exc}")], None
    schedule = ds.schedule
    if config.curriculum is not None:
        for drain in schedule.drains:
            name = ds.buckets[drain.bucket]
            text = (
                f"bucket {name!r} runs dry at sample {drain.position:,} (token {drain.tokens:,}, phase {drain.phase}) "
                f"after {drain.epochs} epoch(s)"
            )
            if ds.halt is drain:
                out.append(Finding("error", f"curriculum.shortfall.{name}", text + ": the run halts there"))
            elif ds.policy is ExhaustionPolicy.RENORMALISE:
                out.append(
                    Finding("warning", f"curriculum.shortfall.{name}", text + ": the rest of the phase renormalises")
                )
            else:
                out.append(Finding("info", f"curriculum.drain.{name}", text + " (after the halt)"))
    if schedule.ended_early:
        severity = "warning" if ds.policy is ExhaustionPolicy.RENORMALISE else "error"
        out.append(Finding(severity, "curriculum.ended_early", f"the curriculum ends early: {schedule.ended_early}"))
    if global_batch_size is not None and max_steps is not None:
        out.extend(_budget(ds, global_batch_size, max_steps))
    return out, ds


def _budget(ds: CurriculumDataset, global_batch_size: int, max_steps: int) -> list[Finding]:
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
    found, ds = findings(config, **options)
    return exit_code(found), found, build_plan(ds) if ds is not None else None


def plot_plan(plan: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """A stacked area of the mix over budget tokens, phase boundaries and drain points marked."""
    matplotlib = require("matplotlib", distribution="tokenloom-curriculum", extra="plot", purpose="plan --plot")
    matplotlib.use("Agg")
    pyplot = require("matplotlib.pyplot", distribution="tokenloom-curriculum", extra="plot", purpose="plan --plot")
    names = [b["name"] for b in plan["buckets"]]
    xs: list[float] = []
    ys: list[list[float]] = [[] for _ in names]
    for segment in plan["segments"]:
        for x in (segment["start_token"], segment["end_token"]):
            xs.append(x)
            for i, name in enumerate(names):
                ys[i].append(segment["weights"].get(name, 0.0))
    figure, axes = pyplot.subplots(figsize=(9, 4.5))
    scale, unit = _scale(max(xs) if xs else 1)
    colours = pyplot.get_cmap("tab10")
    axes.stackplot(
        np.asarray(xs) / scale, np.asarray(ys), labels=names, colors=[colours(i % 10) for i in range(len(names))]
    )
    for phase in plan["phases"][1:]:
        start = _token_at(plan, phase["start_sample"])
        axes.axvline(start / scale, color="black", linewidth=1, linestyle="--")
    for phase in plan["phases"]:
        if phase["samples"] == 0:
            continue
        middle = (_token_at(plan, phase["start_sample"]) + _token_at(plan, phase["end_sample"])) / 2
        axes.text(middle / scale, 1.02, f"phase {phase['index']}", ha="center", va="bottom", fontsize=8)
    for number, drain in enumerate(plan["drains"]):
        axes.axvline(drain["token"] / scale, color="red", linewidth=1.5)
        axes.annotate(
            f"{drain['bucket']} dry ({drain['effect']})",
            xy=(drain["token"] / scale, 0.1 + 0.2 * (number % 4)),
            xytext=(-4, 0),
            textcoords="offset points",
            ha="right",
            color="white",
            fontsize=8,
            bbox={"boxstyle": "round", "facecolor": "red", "edgecolor": "none"},
        )
    axes.set_xlim(0, (max(xs) if xs else 1) / scale)
    axes.set_ylim(0, 1.08)
    axes.set_xlabel(f"budget tokens ({unit})")
    axes.set_ylabel("share of tokens")
    title = f"curriculum plan: {plan['samples']:,} samples, policy {plan['policy']}"
    if plan["ended_early"]:
        title += f"\nended early: {plan['ended_early']}"
    axes.set_title(title, fontsize=9, pad=14)
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
    return Path(path)


def _token_at(plan: dict[str, Any], sample: int) -> int:
    for segment in plan["segments"]:
        if segment["start_sample"] == sample:
            return segment["start_token"]
        if segment["end_sample"] == sample:
            return segment["end_token"]
    return plan["tokens"] if sample >= plan["samples"] else 0


def _scale(largest: float) -> tuple[float, str]:
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if largest >= scale:
            return scale, unit
    return 1.0, "tokens"
