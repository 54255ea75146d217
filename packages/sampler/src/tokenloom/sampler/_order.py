"""Epoch orders: which dataset index sits at each global position of an epoch.

An order is a pure function of (n, seed, epoch, mode, shuffle), never of the
number of replicas; that is what lets a job resume on another world size.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

import numpy as np
import torch

from tokenloom.sampler._block import BlockOrder
from tokenloom.sampler._feistel import FeistelPermutation, round_keys

__all__ = ["EpochOrder", "Order", "epoch_order"]


class Order(StrEnum):
    """How an epoch's order is computed."""

    FEISTEL = "feistel"
    """A keyed Feistel bijection: O(1) memory, any position computed directly (the default)."""
    TORCH = "torch"
    """``torch.randperm(n, generator=manual_seed(seed + epoch))``, as torch's DistributedSampler
    and the seed system: O(n) memory, for resuming checkpoints of those systems."""
    BLOCK = "block"
    """Blocks of consecutive samples in a keyed order, samples shuffled inside a window of blocks:
    O(1) memory, reads in runs (data in object storage); see :mod:`tokenloom.sampler._block`."""


class EpochOrder(Protocol):
    """Maps global positions (int64 array in [0, n)) to dataset indices (int64 array)."""

    def __call__(self, positions: np.ndarray) -> np.ndarray: ...


class _Identity:
    def __call__(self, positions: np.ndarray) -> np.ndarray:
        return positions.astype(np.int64, copy=False)


class _TorchRandperm:
    """Materialises the permutation once per epoch (n int64 values)."""

    def __init__(self, n: int, seed: int, epoch: int) -> None:
        generator = torch.Generator().manual_seed(seed + epoch)
        self._perm = torch.randperm(n, generator=generator).numpy()

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        return self._perm[positions]


def epoch_order(
    n: int, *, seed: int, epoch: int, order: Order, shuffle: bool, block_samples: int = 0, window_blocks: int = 0
) -> EpochOrder:
    """The order of epoch ``epoch``: identity when ``shuffle`` is false."""
    if not shuffle or n <= 1:
        return _Identity()
    if order is Order.BLOCK:
        return BlockOrder(n, seed=seed, epoch=epoch, block_samples=block_samples, window_blocks=window_blocks)
    if order is Order.TORCH:
        return _TorchRandperm(n, seed, epoch)
    return FeistelPermutation(n, round_keys(seed, epoch))
