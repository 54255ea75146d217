"""CurriculumDataset: a map-style dataset whose item g is the sample the schedule puts at g."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

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
from tokenloom.curriculum._drains import drain_effect
from tokenloom.curriculum._errors import BucketExhausted
from tokenloom.curriculum._plan import build_plan
from tokenloom.datasets import MemoryMappedDataset, SampleBatch
from tokenloom.formats import ConfigError, ResumeMismatchError
from tokenloom.sampler import CurriculumSchedule, Drain

__all__ = ["STATE_FORMAT", "CurriculumDataset"]

log = logging.getLogger("tokenloom.curriculum")
STATE_FORMAT = "tokenloom.curriculum/1"
_SEED_RANGE = (-(2**63), 2**64 - 1)
_FEW = 64  # a list of at most this many ints takes the Python path of __getitems__ (a DataLoader batch)


class CurriculumDataset(Dataset[dict[str, torch.Tensor]]):
    """The whole curriculum as one map-style dataset; ``len`` is its sample count.

    Args:
        config: a :class:`CurriculumConfig` (or a path to a config file).
        seed: keys every in-bucket permutation and interleaving.
        global_batch_size: rounds a halt down to the step that contains it, so every
            rank raises at the same step (a step is all or nothing).
        cache_dir: where packing plans are cached (default: tokenloom-datasets' default).
        shuffle: False reads every bucket epoch in storage order.
        bucket_options: passed to every bucket's MemoryMappedDataset / PackedDocumentDataset.
        require_val: every train bucket needs its ``val/<bucket>`` twin (GPT-Simple's layout).
    """

    def __init__(
        self,
        config: CurriculumConfig | str | os.PathLike[str],
        *,
        seed: int,
        global_batch_size: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
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
        self._cache_dir = cache_dir
        self._bucket_options = dict(bucket_options or {})
        self.buckets: list[str] = discover_buckets(self.config.path, source=self.config.source)
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
            open_bucket(
                self.config.path,
                name,
                max_length=self.config.max_length,
                packing=self.config.packing,
                cache_dir=cache_dir,
                options=self._bucket_options,
                unit=self.config.unit,
            )
            for name in self.buckets
        ]
        check_eos(self._buckets)
        if require_val:
            for name in self.buckets:
                check_val_twin(self.config.path, name)
        self.shuffle = shuffle
        self._datasets = [bucket.dataset for bucket in self._buckets]
        self._plain = all(isinstance(d, MemoryMappedDataset) and d.plain for d in self._datasets)
        self._window_dtype = (
            np.result_type(*[d.window_dtype for d in self._datasets]) if self._plain else np.dtype(np.int64)
        )
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
        """The wave-1 dataset serving a train bucket."""
        return self._buckets[self._bucket_index(bucket)].dataset

    def val_dataset(self, bucket: str | int, **options: Any) -> Any:
        """The deterministic eval dataset of ``val/<bucket>`` (no shuffle: read it in order)."""
        name = self.buckets[self._bucket_index(bucket)]
        return open_bucket(
            self.config.path,
            name,
            max_length=self.config.max_length,
            packing=self.config.packing,
            split="val",
            cache_dir=self._cache_dir,
            options={**self._bucket_options, **options},
        ).dataset

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

    def exhausted(self, position: int) -> BucketExhausted:
        """The error for a fetch at or past the halt position (same message on every rank)."""
        halt = self.halt
        if halt is None:  # pragma: no cover - callers check first
            raise RuntimeError("no halt in this plan")
        name = self.buckets[halt.bucket]
        step = self.halt_step()
        at_step = f", global step {step} at global batch {self.global_batch_size}" if step is not None else ""
        epochs = self.config.max_epochs
        error = BucketExhausted(
            f"bucket {name!r} runs dry at sample {halt.position} (phase {halt.phase}, "
            f"token {halt.tokens:,}{at_step}): its {self._buckets[halt.bucket].samples:,} samples "
            f"x {epochs} epoch(s) are used up and the policy is {self.policy.value} "
            f"(sample {position} was asked for)",
            bucket=name,
            phase=halt.phase,
            position=halt.position,
            step=step,
            field="allow_bucket_exhaustion",
        )
        return error.for_worker() if get_worker_info() is not None else error

    # -- fetching -------------------------------------------------------------------------
    def _check(self, index: np.ndarray) -> np.ndarray:
        if not index.size:
            return index
        low, high = int(index.min()), int(index.max())
        if low < 0:
            index = np.where(index < 0, index + len(self), index)
            low, high = int(index.min()), int(index.max())
        if low < 0 or high >= len(self):
            raise IndexError(f"sample indices outside [0, {len(self)})")
        if self.halt is not None and high >= self.halt_position:
            raise self.exhausted(high)
        return index

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        batch = self.__getitems__([index])
        return {key: value[0] for key, value in batch.batched.items()}

    def __getitems__(self, indices: Sequence[int]) -> SampleBatch:
        """One batched fetch per bucket; the batch carries ``bucket`` (int64 id) beside the sample keys."""
        if self._plain and type(indices) is list and 0 < len(indices) <= _FEW and all(type(i) is int for i in indices):
            return self._plain_few(indices)  # a DataLoader batch: the same result without numpy per call
        raw = np.asarray(indices)
        if raw.dtype.kind in "Of" and raw.size and all(type(i) is int for i in np.asarray(indices, object).ravel()):
            # Python ints beyond int64, which numpy holds as object or float
            raise IndexError(f"sample indices outside [0, {len(self)})")
        if raw.dtype.kind not in "iu":  # "3", 1.0, True: never coerced into a sample index
            raise TypeError(f"sample indices must be integers, got {raw.dtype} ({list(indices)[:3]!r})")
        if raw.dtype.kind == "u" and raw.size and int(raw.max()) >= len(self):
            raise IndexError(f"sample indices outside [0, {len(self)})")  # before int64 could wrap 2**64 - 1 to -1
        index = self._check(raw.astype(np.int64, copy=False))
        _, bucket, inner = self.locate(index)
        if self._plain:
            return self._windows_batch(bucket.tolist(), inner.tolist(), bucket)
        parts: dict[int, tuple[np.ndarray, SampleBatch]] = {}
        for b in np.flatnonzero(np.bincount(bucket, minlength=len(self.buckets))).tolist():
            rows = np.flatnonzero(bucket == b)
            parts[b] = (rows, self._buckets[b].dataset.__getitems__(inner[rows].tolist()))
        bucket_ids = bucket.astype(np.int64)
        batched: dict[str, torch.Tensor] = {}
        for rows, part in parts.values():
            for key, value in part.batched.items():
                if key not in batched:
                    batched[key] = torch.empty((len(index), *value.shape[1:]), dtype=value.dtype)
                batched[key][torch.from_numpy(rows)] = value
        batched["bucket"] = torch.from_numpy(bucket_ids)
        return SampleBatch(batched)

    def _plain_few(self, indices: list[int]) -> SampleBatch:
        """:meth:`__getitems__` for fixed windows and a short list of ints, checked as ``_check`` does."""
        length = len(self)
        if min(indices) < 0:
            indices = [i + length if i < 0 else i for i in indices]
        low, high = min(indices), max(indices)
        if low < 0 or high >= length:
            raise IndexError(f"sample indices outside [0, {length})")
        if self.halt is not None and high >= self.halt_position:
            raise self.exhausted(high)
        _, buckets, inner = self.schedule.locate_list(indices)
        return self._windows_batch(buckets, inner, np.asarray(buckets, dtype=np.int64))

    def _windows_batch(self, buckets: list[int], inner: list[int], bucket_ids: np.ndarray) -> SampleBatch:
        """Fixed windows: raw tokens straight into one compact batch, with ``bucket`` beside them."""
        out = np.empty((len(buckets), self.config.max_length + 1), dtype=self._window_dtype)
        datasets = self._datasets
        for row, (b, i) in enumerate(zip(buckets, inner, strict=True)):
            out[row] = datasets[b].window(i)
        return SampleBatch.from_windows(out, extras={"bucket": bucket_ids})

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

    # -- resume ---------------------------------------------------------------------------
    def identity(self) -> dict[str, Any]:
        """What places samples before the first drain: config, seed, data, order, sizes."""
        return {
            "config": self.config.schedule_fingerprint(),
            "seed": self.seed,
            "shuffle": self.shuffle,
            "buckets": list(self.buckets),
            "data": {b.name: b.fingerprint for b in self._buckets},
            "max_length": self.config.max_length,
            "packing": self.config.packing,
            "budget_unit": self.config.unit.value,
        }

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

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Plain JSON; pass the sampler's ``consumed`` so a resume can re-check a halt."""
        state: dict[str, Any] = {
            "format": STATE_FORMAT,
            **self.identity(),
            "policy": self.policy.value,
            "max_repetition": self.config.max_repetition,
            "prefix_end": self._prefix_end(),
            "num_samples": len(self),
        }
        if consumed is not None:
            state["consumed"] = int(consumed)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Refuse a state of another config, seed or data (every differing field listed).

        A changed exhaustion policy is accepted while the saved position is inside the
        stretch every policy shares; a state saved at a halt, loaded with the same
        policy, halts again at once with the same message.
        """
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ResumeMismatchError(
                f"not a curriculum state (format {state.get('format') if isinstance(state, dict) else state!r}, "
                f"expected {STATE_FORMAT!r})",
                field="format",
            )
        ours = self.identity()
        saved = {**state, "budget_unit": state.get("budget_unit", BudgetUnit.INPUT_TOKENS.value)}  # older states
        differences = [
            f"{key}: saved {saved.get(key)!r}, this dataset {value!r}"
            for key, value in ours.items()
            if saved.get(key) != value
        ]
        if differences:
            raise ResumeMismatchError(
                "the state belongs to another curriculum; differing fields: " + "; ".join(differences),
                hint="Resume with the saved config, seed and data, or start afresh",
            )
        consumed = state.get("consumed")
        if consumed is None:
            return
        if isinstance(consumed, bool) or not isinstance(consumed, int) or not 0 <= consumed <= len(self):
            raise ResumeMismatchError(
                f"the state's consumed position is {consumed!r}, expected an int in [0, {len(self)}]",
                field="consumed",
                hint="Load the state this curriculum saved (state_dict()), unedited",
            )
        if state.get("policy") != self.policy.value or state.get("max_repetition") != self.config.max_repetition:
            prefix_end = state.get("prefix_end", 0)
            if isinstance(prefix_end, bool) or not isinstance(prefix_end, int) or prefix_end < 0:
                raise ResumeMismatchError(
                    f"the state's prefix_end (where the exhaustion policies part) is {prefix_end!r}, "
                    "expected an int >= 0",
                    field="prefix_end",
                    hint="Load the state this curriculum saved (state_dict()), unedited",
                )
            common = min(prefix_end, self._prefix_end())
            if consumed > common:
                raise ResumeMismatchError(
                    f"the exhaustion policy changed ({state.get('policy')} -> {self.policy.value}) but the run is "
                    f"at sample {consumed}, past sample {common} where the two schedules part",
                    field="policy",
                    hint="Resume with the saved policy",
                )
            log.info("exhaustion policy %s -> %s at sample %d", state.get("policy"), self.policy.value, consumed)
        if self.halt is not None and consumed >= self.halt_position:
            raise self.exhausted(int(consumed))

    def __repr__(self) -> str:
        return (
            f"CurriculumDataset(samples={len(self)}, buckets={self.buckets}, "
            f"phases={len(self.schedule.durations)}, policy={self.policy.value!r})"
        )
