"""CurriculumDataset: a map-style dataset whose item g is the sample the schedule puts at g."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

from tokenloom.curriculum._buckets import sample_budget_tokens
from tokenloom.curriculum._config import BudgetUnit
from tokenloom.curriculum._errors import BucketExhausted
from tokenloom.curriculum._plan import CurriculumPlan
from tokenloom.datasets import (
    MemoryMappedDataset,
    PrefetchFromSampler,
    SampleBatch,
    with_objects,
)
from tokenloom.formats import ResumeMismatchError
from tokenloom.sampler import check_objects

__all__ = ["STATE_FORMAT", "CurriculumDataset"]

log = logging.getLogger("tokenloom.curriculum")
STATE_FORMAT = "tokenloom.curriculum/1"
_EXACT_USED = 1 << 22  # used_bytes over packed buckets: exact up to this many positions
_FEW = 64  # a list of at most this many ints takes the Python path of __getitems__ (a DataLoader batch)


class CurriculumDataset(PrefetchFromSampler, CurriculumPlan, Dataset[dict[str, torch.Tensor]]):
    """The whole curriculum as one map-style dataset; ``len`` is its sample count.

    Args:
        config: a :class:`CurriculumConfig` (or a path to a config file).
        seed: keys every in-bucket permutation and interleaving.
        global_batch_size: rounds a halt down to the step that contains it, so every
            rank raises at the same step (a step is all or nothing).
        plan_cache_dir: where packing plans are cached (default: tokenloom-datasets' default).
        shuffle: False reads every bucket epoch in storage order.
        bucket_options: passed to every bucket's MemoryMappedDataset / PackedDocumentDataset.
        require_val: every train bucket needs its ``val/<bucket>`` twin (GPT-Simple's layout).

    The schedule, the halt and the plan are :class:`CurriculumPlan`'s; this class opens the buckets as
    the wave-1 datasets and serves their samples. Over buckets in object storage,
    ``prefetch(sampler, batch_size=, lookahead=, num_workers=)`` fetches the blocks of each reader's next
    samples ahead of use and lets the cache evict by that known future (as the wave-1 datasets do).
    """

    _index_only = False

    def _opened(self) -> None:
        self._datasets = [bucket.dataset for bucket in self._buckets]
        self._plain = all(isinstance(d, MemoryMappedDataset) and d.plain for d in self._datasets)
        self._window_dtype = (
            np.result_type(*[d.window_dtype for d in self._datasets]) if self._plain else np.dtype(np.int64)
        )
        self._resumed_at = 0  # fetch_figures' default start: the position load_state_dict resumed at
        self._fetched_at_open = self._node_fetched()  # the node's ledger may hold earlier runs' fetches

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

    # -- prefetch: the schedule maps each future position to its bucket's blocks ---------
    def remote_caches(self) -> list[Any]:
        return [cache for dataset in self._datasets for cache in dataset.remote_caches()]

    def blocks_of(self, indices: list[int]) -> list[list[tuple[Any, Any, int]]]:
        """The cache blocks each curriculum position of ``indices`` reads, from its bucket dataset."""
        blocks: list[list[tuple[Any, Any, int]]] = [[] for _ in indices]
        position = np.asarray(indices, dtype=np.int64)
        rows = np.flatnonzero(position < self.halt_position)  # past a halt the reader raises: nothing to fetch
        if not len(rows):
            return blocks
        _, bucket, inner = self.locate(position[rows])
        for b in np.unique(bucket).tolist():
            picked = bucket == b
            per_sample = self._datasets[b].blocks_of(inner[picked].tolist())
            for row, sample_blocks in zip(rows[picked].tolist(), per_sample, strict=True):
                blocks[row] = sample_blocks
        return blocks

    def used_bytes(self, end: int, start: int = 0) -> int:
        """Token bytes the samples at positions [start, end) read: (L + 1) tokens a fixed window (exact,
        O(buckets)); a packed sequence's non-padding tokens (exact up to 2^22 positions, O(positions); beyond,
        each bucket's mean sample)."""
        if not 0 <= start <= end <= len(self):
            raise IndexError(f"positions [{start}, {end}) outside [0, {len(self)}]")
        itemsize = [int(np.dtype(d.dataset.dtype).itemsize) for d in self._datasets]
        if not self.config.packing:
            draws = (self.schedule.counts_before(end) - self.schedule.counts_before(start)).tolist()
            return sum(n * (self.config.seq_len + 1) * size for n, size in zip(draws, itemsize, strict=True))
        inputs = [sample_budget_tokens(b.dataset, BudgetUnit.INPUT_TOKENS) for b in self._buckets]
        if end - start > _EXACT_USED:
            draws = (self.schedule.counts_before(end) - self.schedule.counts_before(start)).tolist()
            means = [float(np.mean(t)) if len(t) else 0.0 for t in (np.atleast_1d(x) for x in inputs)]
            return sum(round(n * m) * size for n, m, size in zip(draws, means, itemsize, strict=True))
        total = 0
        for first in range(start, end, 1 << 20):
            _, bucket, inner = self.locate(np.arange(first, min(first + (1 << 20), end)))
            for b in np.unique(bucket).tolist():
                per_sample = np.atleast_1d(inputs[b])
                picked = inner[bucket == b]
                tokens = per_sample[picked] if len(per_sample) > 1 else np.full(len(picked), per_sample[0])
                total += int(tokens.sum()) * itemsize[b]
        return total

    def fetch_figures(self, consumed: int, *, start: int | None = None) -> dict[str, Any]:
        """What this node fetched for the buckets since this dataset was opened, against what the samples
        [start, consumed) used, in bytes (``start`` None: where :meth:`load_state_dict` resumed, 0 without a resume).

        ``fetched_bytes``: token blocks this node's cache fetched for the train buckets' objects since the
        dataset was opened, read from the cache's ledger (all processes of the node; evicted and fetched again
        counts twice; earlier runs on the same cache directory do not count). ``used_bytes``: :meth:`used_bytes`.
        Pass them to :func:`write_run_status` and ``tokenloom curriculum status`` shows them; local buckets fetch
        nothing (``fetched_bytes`` 0). On several nodes, add the nodes' fetched bytes.
        """
        used = self.used_bytes(consumed, self._resumed_at if start is None else start)
        fetched = self._node_fetched() - self._fetched_at_open
        return {
            "used_bytes": used,
            "fetched_bytes": fetched,
            "fetched_per_used": round(fetched / used, 4) if used else None,
        }

    def _node_fetched(self) -> int:
        """Bytes the node's caches have fetched for the train buckets' objects, as their ledgers say."""
        roots = sorted({str(cache.root) for cache in self.remote_caches()})
        if not roots:
            return 0
        from tokenloom.formats.remote.cache import fetched_bytes

        objects = self.data_objects()
        return sum(fetched_bytes(root, objects) for root in roots)

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
        if self._prefetch_spec is not None:
            self._prefetch_consumed(indices)
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
        out = np.empty((len(buckets), self.config.seq_len + 1), dtype=self._window_dtype)
        datasets = self._datasets
        for row, (b, i) in enumerate(zip(buckets, inner, strict=True)):
            out[row] = datasets[b].window(i)
        return SampleBatch.from_windows(out, extras={"bucket": bucket_ids})

    # -- resume ---------------------------------------------------------------------------
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
        return with_objects(state, self.data_objects())

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
        ours = {"orders": None, **self.identity()}  # a state in block order never loads into the feistel order
        saved = {**state, "budget_unit": state.get("budget_unit", BudgetUnit.INPUT_TOKENS.value)}  # older states
        differences = [
            f"{key}: saved {saved.get(key)!r}, this dataset {value!r}"
            for key, value in ours.items()
            if saved.get(key) != value
        ]
        if differences:
            check_objects(
                state.get("data_objects"),
                self.data_objects(),
                what="the curriculum state was saved on other data: ",
                field="data",
            )
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
        self._resumed_at = consumed
        if self.halt is not None and consumed >= self.halt_position:
            raise self.exhausted(int(consumed))
