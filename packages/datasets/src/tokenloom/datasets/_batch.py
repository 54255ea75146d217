"""Batched fetch for DataLoader: ``__getitems__`` results and the collate that keeps them batched.

``torch.utils.data.DataLoader`` calls ``dataset.__getitems__(indices)`` when a
dataset has it, then ``collate_fn`` on the result. Our datasets build a whole
batch in one vectorised call and return a :class:`SampleBatch`: a list of
per-sample dicts (so ``default_collate`` still works) that also carries the
batched tensors; :func:`collate` hands those over without stacking again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import default_collate

__all__ = ["SampleBatch", "collate"]


class SampleBatch(list):
    """Per-sample dicts (row views) plus ``batched``: the same data as ``(B, ...)`` tensors."""

    batched: dict[str, torch.Tensor]

    def __init__(self, batched: Mapping[str, torch.Tensor]) -> None:
        size = len(next(iter(batched.values()))) if batched else 0
        super().__init__({key: value[i] for key, value in batched.items()} for i in range(size))
        self.batched = dict(batched)


def collate(batch: Sequence[Any]) -> Any:
    """``default_collate``, except that a :class:`SampleBatch` is returned as its batched tensors."""
    if isinstance(batch, SampleBatch):
        return batch.batched
    return default_collate(list(batch))
