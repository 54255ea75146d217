"""The plan: everything the schedule decides before step 0, computed without torch.

:class:`CurriculumPlan` opens every bucket as a torch-free index (sample counts, budget tokens,
fingerprints), builds the sampler's :class:`~tokenloom.sampler.CurriculumSchedule` and finds the
halt; :func:`build_plan` writes it out as plain JSON (phases, inventory, drains, segments).
``tokenloom validate --curriculum`` and ``curriculum plan`` stop here; :class:`CurriculumDataset`
is the same plan over the wave-1 datasets, serving samples.

A config that validates clean has no drain and no budget mismatch, so it never halts at runtime:
the halt position is part of this same plan. The findings about it live in ``_findings``, its
picture in ``_plot``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from tokenloom.curriculum._buckets import (
    Bucket,
    check_eos,
    check_val_twin,
    discover_buckets,
    is_empty_dir,
    open_bucket,
    sample_budget_tokens,
)
from tokenloom.curriculum._config import BudgetUnit, CurriculumConfig, ExhaustionPolicy
from tokenloom.curriculum._drains import drain_effect, drain_rows
from tokenloom.formats import ConfigError
from tokenloom.sampler import CurriculumSchedule, Drain, data_objects

__all__ = ["CurriculumPlan", "build_plan"]

log = logging.getLogger("tokenloom.curriculum")
_SEED_RANGE = (-(2**63), 2**64 - 1)


class CurriculumPlan:
    """The schedule of a curriculum and what it decides before step 0: ``len``, phases, drains, the halt.

    Takes :class:`CurriculumDataset`'s arguments and reads the same data, but opens every bucket as a
    torch-free index (:class:`~tokenloom.datasets.WindowIndex` / :class:`~tokenloom.datasets.PackedIndex`):
    the same sample counts, budget tokens and fingerprints, no sample building.
    """

    _index_only = True
    """Open buckets as their torch-free indexes (True) or as the wave-1 datasets (False)."""

    def __init__(
        self,
        config: CurriculumConfig | str | os.PathLike[str],
        *,
        seed: int,
        global_batch_size: int | None = None,
        plan_cache_dir: str | os.PathLike[str] | None = None,
        shuffle: bool = True,
        bucket_options: dict[str, Any] | None = None,
        require_val: bool = True,
    ) -> None:
        self.config = config if isinstance(config, CurriculumConfig) else CurriculumConfig.from_file(config)
        if isinstance(seed, bool) or not isinstance(seed, int) or not _SEED_RANGE[0] <= seed <= _SEED_RANGE[1]:
            raise ConfigError(f"seed is {seed!r}, expected an integer in [-2**63, 2**64)", field="seed")
        self.seed = seed
        if global_batch_size is not None and (isinstance(global_batch_size, bool) or global_batch_size < 1):
            raise ConfigError(f"global_batch_size is {global_batch_size!r}, expected >= 1", field="global_batch_size")
        self.global_batch_size = global_batch_size
        self._plan_cache_dir = plan_cache_dir
        self._bucket_options = dict(bucket_options or {})
        self.buckets: list[str] = discover_buckets(self.config.path, source=self.config.source)
        skipped: list[str] = []
        if self.config.curriculum is not None:  # an empty bucket no phase names is skipped, not opened
            named = self.config.buckets_named()
            skipped = [n for n in self.buckets if n not in named and is_empty_dir(self.config.path / "train" / n)]
            if skipped:
                log.warning("skipping empty bucket(s) %s: no phase of the curriculum uses them", skipped)
                self.buckets = [n for n in self.buckets if n not in skipped]
        unknown = sorted(self.config.buckets_named() - set(self.buckets))
        if unknown:
            raise ConfigError(
                f"the curriculum names buckets {unknown} that are not under {self.config.path / 'train'}; "
                f"found {self.buckets}",
                path=self.config.source,
                field="curriculum.mix",
                hint="Fix the bucket names in the mix or add the bucket directories",
            )
        self._buckets: list[Bucket] = [
            self._open(name, "train", self._bucket_options, unit=self.config.unit, eos_id=self.config.eos_id)
            for name in self.buckets
        ]
        check_eos(self._buckets)
        self._check_orders(skipped)
        if require_val:
            for name in self.buckets:
                check_val_twin(self.config.path, name)
        self.shuffle = shuffle
        self.schedule = self._make_schedule()
        self._shared_prefix: int | None = None
        self.halt: Drain | None = None
        self.halt_position = len(self)
        if self.policy is not ExhaustionPolicy.RENORMALISE and self.config.curriculum is not None:
            if self.schedule.drains:
                self.halt = self.schedule.drains[0]
                position = self.halt.position
                if global_batch_size:
                    position -= position % global_batch_size
                self.halt_position = position
            elif self.schedule.ended_early:
                self.halt_position = len(self)
        for drain in self.schedule.drains:
            log.info(
                "bucket %r runs dry at sample %d (phase %d, token %d): %s",
                self.buckets[drain.bucket], drain.position, drain.phase, drain.tokens,
                drain_effect(drain, self.halt, "renormalising the rest of the phase"),
            )  # fmt: skip
        self._opened()

    def _check_orders(self, skipped: list[str]) -> None:
        order = self.config.order
        # an order for an empty bucket no phase uses is moot, as the bucket is (skipped, not opened)
        unknown = sorted(set(order) - set(self.buckets) - set(skipped)) if isinstance(order, dict) else []
        if unknown:
            raise ConfigError(
                f"order names buckets {unknown} that are not under {self.config.path / 'train'}; found {self.buckets}",
                path=self.config.source,
                field=f"order.{unknown[0]}",
                hint="Fix the bucket names in the order mapping",
            )
        self.orders = [self.config.bucket_order(name) for name in self.buckets]

    def _opened(self) -> None:
        """Called at the end of ``__init__``, buckets open: a subclass that serves samples prepares here."""

    # -- the schedule ---------------------------------------------------------------------
    @property
    def policy(self) -> ExhaustionPolicy:
        return self.config.policy

    def _weights(self) -> tuple[list[int], np.ndarray]:
        """Phase durations and the (phases, buckets) weight matrix; no curriculum = one phase."""
        if self.config.curriculum is None:
            tokens = np.asarray([b.budget_tokens for b in self._buckets], dtype=np.float64)
            return [int(tokens.sum())], (tokens / tokens.sum())[None, :]
        index = {name: i for i, name in enumerate(self.buckets)}
        weights = np.zeros((len(self.config.curriculum), len(self.buckets)))
        for p, phase in enumerate(self.config.curriculum):
            for name, weight in phase.mix.items():
                weights[p, index[name]] = weight
        return [p.duration_tokens for p in self.config.curriculum], weights

    def _make_schedule(self) -> CurriculumSchedule:
        durations, weights = self._weights()
        schedule = self._schedule(durations, weights, self.config.max_epochs)
        self.phase_budgets = list(durations)
        if self.config.unit is BudgetUnit.LOSS_TOKENS:
            # GPT-Simple's loop counts each phase from zero: the tokens by which the sample that ends a phase
            # overshoots its budget do not count toward the next phase (tokenloom's default carries them).
            # The schedule cuts phases at cumulative targets, so each next target absorbs the overshoot.
            adjusted = list(durations)
            for phase in range(len(durations) - 1):
                if schedule.ended_early is not None:
                    break
                overshoot = sum(schedule.phase_tokens[: phase + 1]) - sum(adjusted[: phase + 1])
                if overshoot > 0:
                    adjusted[phase + 1] = durations[phase + 1] + overshoot
                    schedule = self._schedule(adjusted, weights, self.config.max_epochs)
        return schedule

    def _schedule(self, durations: list[int], weights: np.ndarray, max_epochs: int) -> CurriculumSchedule:
        return CurriculumSchedule(
            [b.samples for b in self._buckets],
            [b.budget_tokens for b in self._buckets],
            durations,
            weights,
            seed=self.seed,
            max_epochs=max_epochs,
            shuffle=self.shuffle,
            orders=self.orders,
        )

    def __len__(self) -> int:
        return self.schedule.num_samples

    def locate(self, positions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(phase, bucket, index inside the bucket) of global positions; bucket indexes ``self.buckets``."""
        return self.schedule.locate(np.asarray(positions, dtype=np.int64).reshape(-1))

    def plan(self) -> dict[str, Any]:
        """The whole plan as plain JSON: phases (start/end sample, tokens), per-bucket inventory and demand,
        drain points, segments, the halt (see :func:`tokenloom.curriculum.build_plan`)."""
        return build_plan(self)

    def bucket_dataset(self, bucket: str | int) -> Any:
        """The wave-1 dataset serving a train bucket (its torch-free index in a :class:`CurriculumPlan`)."""
        return self._buckets[self._bucket_index(bucket)].dataset

    def val_dataset(self, bucket: str | int, **options: Any) -> Any:
        """The deterministic eval dataset of ``val/<bucket>`` (no shuffle: read it in order; its index in a plan)."""
        return self._open(self.buckets[self._bucket_index(bucket)], "val", {**self._bucket_options, **options}).dataset

    def _open(self, name: str, split: str, options: dict[str, Any], **budget: Any) -> Bucket:
        config = self.config
        cache, index_only = self._plan_cache_dir, self._index_only
        return open_bucket(
            config.path, name, seq_len=config.seq_len, packing=config.packing, split=split, plan_cache_dir=cache,
            options=options, index_only=index_only, **budget,
        )  # fmt: skip

    def _bucket_index(self, bucket: str | int) -> int:
        if isinstance(bucket, str):
            if bucket not in self.buckets:
                raise ConfigError(f"no bucket {bucket!r}; buckets: {self.buckets}", field="bucket")
            return self.buckets.index(bucket)
        if not 0 <= bucket < len(self.buckets):
            raise ConfigError(f"bucket id {bucket} outside [0, {len(self.buckets)})", field="bucket")
        return int(bucket)

    def halt_step(self) -> int | None:
        """The global step at which training halts (needs ``global_batch_size``); None if it never does."""
        if self.halt is None or not self.global_batch_size:
            return None
        return self.halt_position // self.global_batch_size

    def budget_tokens(self, positions: Any, unit: BudgetUnit | str | None = None) -> np.ndarray:
        """Budget tokens of the samples at ``positions`` in the config's unit (or ``unit``); exact per sample."""
        _, bucket, inner = self.locate(positions)
        out = np.empty(len(inner), dtype=np.int64)
        wanted = self.config.unit if unit is None else BudgetUnit(unit)
        for b in np.flatnonzero(np.bincount(bucket, minlength=len(self.buckets))).tolist():
            rows = np.flatnonzero(bucket == b)
            if wanted is self.config.unit:
                per_sample = self._buckets[b].per_sample
            else:
                per_sample = sample_budget_tokens(self._buckets[b].dataset, wanted)
            out[rows] = per_sample if isinstance(per_sample, int) else per_sample[inner[rows]]
        return out

    # -- identity -------------------------------------------------------------------------
    def identity(self) -> dict[str, Any]:
        """What places samples before the first drain: config, seed, data, order, sizes."""
        return {
            "config": self.config.schedule_fingerprint(),
            "seed": self.seed,
            "shuffle": self.shuffle,
            "buckets": list(self.buckets),
            "data": {b.name: b.fingerprint for b in self._buckets},
            "max_length": self.config.seq_len,  # the recorded key keeps its first name: old plans resume
            "packing": self.config.packing,
            "budget_unit": self.config.unit.value,
            **self._order_identity(),
        }

    def _order_identity(self) -> dict[str, Any]:
        """The block orders as resolved (defaults filled in); nothing when every bucket is feistel (older states)."""
        if all(o is None for o in self.orders) or not self.shuffle:
            return {}
        return {"orders": {n: list(o) for n, o in zip(self.buckets, self.orders, strict=True) if o is not None}}

    def data_objects(self) -> dict[str, str]:
        """``{URL: "size:ETag"}`` of the train buckets' objects in storage ({} on disk); saved in states."""
        return data_objects(*(bucket.dataset for bucket in self._buckets))

    def _prefix_end(self) -> int:
        """Up to here every exhaustion policy gives the same schedule (the first one-epoch drain)."""
        if self._shared_prefix is None:
            self._shared_prefix = self._first_drain()
        return self._shared_prefix

    def _first_drain(self) -> int:
        if self.policy is ExhaustionPolicy.REPEAT:
            _, weights = self._weights()
            first = self._schedule(self.schedule.durations, weights, 1).drains
        else:
            first = self.schedule.drains
        return first[0].position if first else len(self)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(samples={len(self)}, buckets={self.buckets}, "
            f"phases={len(self.schedule.durations)}, policy={self.policy.value!r})"
        )


def build_plan(ds: CurriculumPlan) -> dict[str, Any]:
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
        block = ds.orders[b]
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
                "order": "feistel" if block is None else "block",
                **({"block_samples": block[0], "window_blocks": block[1]} if block is not None else {}),
            }
        )
    return {
        "config": ds.config.source,
        "seed": ds.seed,
        "policy": ds.policy.value,
        "max_length": ds.config.seq_len,
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
