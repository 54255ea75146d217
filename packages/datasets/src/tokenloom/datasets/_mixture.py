"""MixtureDataset: deterministic weighted interleaving of map-style datasets.

The order of sources is Tijdeman's solution of the chairman-assignment problem
(an earliest-deadline refinement of Megatron's lowest-error greedy): after any
prefix of n samples, source s has been chosen within ``1 - 1/(2(S-1))`` (< 1)
of ``weights[s] * n`` times. Megatron's plain greedy can drift just past one
sample; this one cannot. No randomness is needed for the schedule; the seed
rotates where each source starts, and each epoch continues through a source
from where the previous one stopped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from tokenloom.datasets._batch import SampleBatch, stack_samples
from tokenloom.datasets._state import check_state, settings_fingerprint
from tokenloom.formats import ConfigError

__all__ = ["MixtureDataset", "interleave", "validate_weights"]

WEIGHT_TOLERANCE = 1e-6


def validate_weights(weights: Sequence[float], count: int) -> np.ndarray:
    """``weights`` as float64 if there is one per source, each finite and >= 0, summing to 1 within 1e-6."""
    array = np.asarray(weights, dtype=np.float64)
    if array.ndim != 1 or len(array) != count or count == 0:
        raise ConfigError(f"{len(array)} weights for {count} datasets, expected one per dataset", field="weights")
    if not np.isfinite(array).all() or (array < 0).any():
        raise ConfigError(f"weights {array.tolist()} must be finite and non-negative", field="weights")
    if abs(float(array.sum()) - 1.0) > WEIGHT_TOLERANCE:
        raise ConfigError(
            f"weights sum to {float(array.sum())!r}, expected 1 (within {WEIGHT_TOLERANCE})",
            field="weights",
            hint="Normalise the weights (w / sum(w))",
        )
    return array


def interleave(weights: np.ndarray, num_samples: int) -> np.ndarray:
    """The source of each of ``num_samples`` positions (Tijdeman's earliest-deadline assignment)."""
    count = len(weights)
    sigma = 1.0 / (2 * count - 2) if count > 1 else 0.5
    w = [float(x) for x in weights]
    chosen = [0] * count
    out = np.empty(num_samples, dtype=np.int64)
    sources = range(count)
    for position in range(num_samples):
        time = position + 1
        best, deadline = -1, math.inf
        for s in sources:
            if w[s] > 0 and w[s] * time - chosen[s] >= sigma - 1e-12:
                due = (chosen[s] + 1 - sigma) / w[s]
                if due < deadline:
                    best, deadline = s, due
        if best < 0:  # not reached for valid weights (Tijdeman's theorem); keeps the loop total
            best = max(sources, key=lambda s: w[s] * time - chosen[s])
        chosen[best] += 1
        out[position] = best
    return out


class MixtureDataset(Dataset[dict[str, Any]]):
    """Samples from several datasets in fixed proportions.

    Args:
        datasets: map-style datasets with the same output keys.
        weights: one per dataset, non-negative, summing to 1.
        seed: rotates each source's starting sample (counter-based, no global RNG).
        num_samples: the mixture's length; default the sum of the sources' lengths.
    """

    def __init__(
        self,
        datasets: Sequence[Dataset[Any]],
        weights: Sequence[float],
        *,
        seed: int,
        num_samples: int | None = None,
    ) -> None:
        self.datasets = list(datasets)
        self.weights = validate_weights(weights, len(self.datasets))
        lengths = [len(d) for d in self.datasets]  # type: ignore[arg-type]
        empty = [i for i, (n, w) in enumerate(zip(lengths, self.weights, strict=True)) if n == 0 and w > 0]
        if empty:
            raise ConfigError(f"dataset {empty[0]} is empty but has weight {self.weights[empty[0]]}", field="datasets")
        self.num_samples = int(num_samples if num_samples is not None else sum(lengths))
        if self.num_samples < 1:
            raise ConfigError(f"num_samples is {self.num_samples}, expected >= 1", field="num_samples")
        self.seed = int(seed)
        self.source_lengths = np.asarray(lengths, dtype=np.int64)
        self.source_of = interleave(self.weights, self.num_samples)
        self.source_counts = np.bincount(self.source_of, minlength=len(self.datasets))
        # n-th draw from its source, for every position
        self.draw_of = np.empty(self.num_samples, dtype=np.int64)
        for s in range(len(self.datasets)):
            where = np.flatnonzero(self.source_of == s)
            self.draw_of[where] = np.arange(len(where))
        self.epoch = 0
        self._fingerprint = settings_fingerprint(
            sources=[_source_fingerprint(d) for d in self.datasets],
            weights=self.weights.tolist(),
            seed=self.seed,
            num_samples=self.num_samples,
        )

    def __len__(self) -> int:
        return self.num_samples

    def fingerprint(self) -> str:
        return self._fingerprint

    def set_epoch(self, epoch: int) -> None:
        """Epoch e continues each source where epoch e - 1 stopped."""
        if epoch < 0:
            raise ConfigError(f"epoch is {epoch}, expected >= 0", field="epoch")
        self.epoch = int(epoch)

    def _rotation(self, source: int) -> int:
        if self.source_lengths[source] == 0:
            return 0
        generator = np.random.Generator(np.random.Philox(key=[self.seed & (2**64 - 1), source]))
        return int(generator.integers(self.source_lengths[source]))

    def locate(self, index: int) -> tuple[int, int]:
        """(source, index inside that source) of mixture position ``index``."""
        if index < 0:
            index += self.num_samples
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample {index} out of range for a mixture of {self.num_samples}")
        source = int(self.source_of[index])
        draw = self._rotation(source) + self.epoch * int(self.source_counts[source]) + int(self.draw_of[index])
        return source, draw % int(self.source_lengths[source])

    def __getitem__(self, index: int) -> Any:
        source, inner = self.locate(index)
        return self.datasets[source][inner]

    def __getitems__(self, indices: Sequence[int]) -> SampleBatch | list[Any]:
        """One batched fetch per source; a :class:`SampleBatch` when the samples are alike tensors."""
        located = [self.locate(i) for i in indices]
        samples: list[Any] = [None] * len(located)
        for source in {s for s, _ in located}:
            rows = [row for row, (s, _) in enumerate(located) if s == source]
            inner = [located[row][1] for row in rows]
            dataset = self.datasets[source]
            fetch = getattr(dataset, "__getitems__", None)
            got = list(fetch(inner)) if fetch is not None else [dataset[i] for i in inner]
            for row, sample in zip(rows, got, strict=True):
                samples[row] = sample
        stacked = stack_samples(samples)
        return samples if stacked is None else SampleBatch(stacked)

    def state_dict(self) -> dict[str, Any]:
        return {"fingerprint": self._fingerprint, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, fingerprint=self._fingerprint, owner="MixtureDataset")
        self.set_epoch(int(state.get("epoch", 0)))


def _source_fingerprint(dataset: Any) -> str:
    fingerprint = getattr(dataset, "fingerprint", None)
    if callable(fingerprint):
        return str(fingerprint())
    return f"{type(dataset).__name__}:{len(dataset)}"
