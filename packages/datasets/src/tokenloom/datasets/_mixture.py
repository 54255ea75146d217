"""MixtureDataset: deterministic weighted interleaving of map-style datasets.

The order of sources is tokenloom.sampler's :class:`MixSchedule` (a one-phase
curriculum): a lowest-discrepancy split tree evaluated per position, so the
mixture stores nothing of its length (wave 1 kept two int64 arrays of it and
built them in a Python loop: 4.25 s and 153 MiB per 10^7 samples). After any
prefix of n samples, source s has been chosen within
``schedule.discrepancy(s)`` (about one sample; reported) of its rate times n.
The seed rotates where each source starts, and each epoch continues through a
source from where the previous one stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from tokenloom.datasets._batch import SampleBatch, stack_samples
from tokenloom.datasets._state import FingerprintState, settings_fingerprint
from tokenloom.formats import ConfigError
from tokenloom.sampler import MixSchedule, data_fingerprint, data_objects

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
    """The source of each of ``num_samples`` positions (the :class:`MixSchedule` of ``weights``)."""
    return MixSchedule(np.asarray(weights, dtype=np.float64)).locate(np.arange(num_samples, dtype=np.int64))[0]


class MixtureDataset(FingerprintState, Dataset[dict[str, Any]]):
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
        self.schedule = MixSchedule(self.weights)
        self.source_counts = self.schedule.counts(self.num_samples)
        self._rotations = np.asarray([self._rotation(s) for s in range(len(self.datasets))], dtype=np.int64)
        self.epoch = 0
        self._fingerprint = settings_fingerprint(
            sources=[data_fingerprint(d) or f"{type(d).__name__}:{len(d)}" for d in self.datasets],  # type: ignore[arg-type]
            weights=self.weights.tolist(),
            seed=self.seed,
            num_samples=self.num_samples,
        )

    def __len__(self) -> int:
        return self.num_samples

    def data_objects(self) -> dict[str, str]:
        """``{URL: "size:ETag"}`` of the sources' objects in storage ({} on disk); saved in states."""
        return data_objects(*self.datasets)

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
        source, inner = self.locate_many(np.asarray([index], dtype=np.int64))
        return int(source[0]), int(inner[0])

    def locate_many(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised :meth:`locate`: (source, index inside it) of every position."""
        index = np.asarray(indices, dtype=np.int64)
        index = np.where(index < 0, index + self.num_samples, index)
        if index.size and (index.min() < 0 or index.max() >= self.num_samples):
            bad = int(index[(index < 0) | (index >= self.num_samples)][0])
            raise IndexError(f"sample {bad} out of range for a mixture of {self.num_samples}")
        source, draw = self.schedule.locate(index)
        draw = self._rotations[source] + self.epoch * self.source_counts[source] + draw
        return source, draw % np.maximum(self.source_lengths[source], 1)

    def __getitem__(self, index: int) -> Any:
        source, inner = self.locate(index)
        return self.datasets[source][inner]

    def __getitems__(self, indices: Sequence[int]) -> SampleBatch | list[Any]:
        """One batched fetch per source; a :class:`SampleBatch` when the samples are alike tensors."""
        sources, inners = self.locate_many(np.asarray(indices, dtype=np.int64))
        samples: list[Any] = [None] * len(sources)
        for source in np.unique(sources).tolist():
            rows = np.flatnonzero(sources == source).tolist()
            inner = inners[rows].tolist()
            dataset = self.datasets[source]
            fetch = getattr(dataset, "__getitems__", None)
            got = list(fetch(inner)) if fetch is not None else [dataset[i] for i in inner]
            for row, sample in zip(rows, got, strict=True):
                samples[row] = sample
        stacked = stack_samples(samples)
        return samples if stacked is None else SampleBatch(stacked)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.set_epoch(int(state.get("epoch", 0)))
