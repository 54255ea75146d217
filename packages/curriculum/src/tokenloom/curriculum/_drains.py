"""Drain points: where a bucket runs dry, what that does under the exhaustion policy, and how it is said.

The schedule knows every drain before step 0 (``CurriculumSchedule.drains``); the plan logs them,
lists them and the findings judge them, all in the words of this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from tokenloom.curriculum._config import CurriculumConfig, ExhaustionPolicy

if TYPE_CHECKING:
    from tokenloom.sampler import CurriculumSchedule, Drain

__all__ = ["drain_effect", "drain_rows", "drain_verdicts"]


class PlannedDrains(Protocol):
    """What the drain table and verdicts read of a plan (``CurriculumPlan`` meets it)."""

    config: CurriculumConfig
    buckets: list[str]
    schedule: CurriculumSchedule
    halt: Drain | None

    @property
    def policy(self) -> ExhaustionPolicy: ...


def drain_effect(drain: Drain, halt: Drain | None, otherwise: str = "renormalise") -> str:
    """What a drain does: the first one under a halting policy stops the run; later ones are never reached."""
    if halt is None:
        return otherwise
    if drain is halt:
        return "halt"
    return "not reached (after the halt)"


def drain_rows(ds: PlannedDrains) -> list[dict[str, Any]]:
    """The plan's drain table: bucket, sample, token, phase, epochs and effect of every drain."""
    return [
        {
            "bucket": ds.buckets[d.bucket],
            "sample": d.position,
            "token": d.tokens,
            "phase": d.phase,
            "epochs": d.epochs,
            "effect": drain_effect(d, ds.halt),
        }
        for d in ds.schedule.drains
    ]


def drain_verdicts(ds: PlannedDrains) -> list[tuple[str, str, str]]:
    """(severity, code, message) per drain of a phased curriculum: the halting one blocks, a renormalising
    one warns, one after the halt is only said."""
    if ds.config.curriculum is None:
        return []
    out = []
    for drain in ds.schedule.drains:
        name = ds.buckets[drain.bucket]
        text = (
            f"bucket {name!r} runs dry at sample {drain.position:,} (token {drain.tokens:,}, phase {drain.phase}) "
            f"after {drain.epochs} epoch(s)"
        )
        if ds.halt is drain:
            out.append(("error", f"curriculum.shortfall.{name}", text + ": the run halts there"))
        elif ds.policy is ExhaustionPolicy.RENORMALISE:
            out.append(("warning", f"curriculum.shortfall.{name}", text + ": the rest of the phase renormalises"))
        else:
            out.append(("info", f"curriculum.drain.{name}", text + " (after the halt)"))
    return out
