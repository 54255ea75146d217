"""The plan: everything the schedule decides before step 0, as plain JSON (phases, inventory, drains, segments).

A config that validates clean has no drain and no budget mismatch, so it never halts at runtime:
the halt position is part of this same plan. The findings about it live in ``_findings``, its
picture in ``_plot``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tokenloom.curriculum._drains import drain_rows

if TYPE_CHECKING:  # the dataset builds its plan with this module: no import back at run time
    from tokenloom.curriculum._dataset import CurriculumDataset

__all__ = ["build_plan"]


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
        "drains": drain_rows(ds),
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
