"""A stream's samples, collated into batches that cross from a DataLoader worker to the main process cheaply.

``default_collate`` stacks each key into its own shared-memory tensor, and each such tensor reaches the main
process as a file descriptor handed over a socket with an authentication handshake: two of them per batch cost
the main process more CPU than the plain pipeline spends on the batch's tokens. The stream's samples are
:class:`StreamSample` s, which ``default_collate`` hands to :func:`collate_samples` (torch's documented registry):
plain windows (``input_ids`` / ``labels`` of one ``seq_len + 1`` window) go as tokenloom.datasets' window batch, the
tokens inside the pickle (uint16 where the ids fit) and widened to int64 in the main process; any other sample goes
as one shared storage for all its keys. Either way the training loop gets a plain dict of int64 tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import get_worker_info
from torch.utils.data._utils.collate import collate, default_collate_fn_map

from tokenloom.datasets import WindowBatch, stack_samples, windows_to_sample

__all__ = ["StreamSample", "collate_samples", "window_batch"]


class StreamSample(dict[str, torch.Tensor]):
    """One sample (a dict of tensors) that remembers its ``seq_len + 1`` token window when it is a plain one."""

    __slots__ = ("window",)

    def __init__(self, tensors: dict[str, torch.Tensor], window: np.ndarray | None = None) -> None:
        super().__init__(tensors)
        self.window = window
        """The window whose ``[:-1]`` / ``[1:]`` are input_ids / labels; None when the sample holds more."""

    def __reduce__(self) -> Any:
        return (dict, (dict(self),))


def collate_samples(
    batch: Sequence[StreamSample], *, collate_fn_map: dict[Any, Callable[..., Any]] | None = None
) -> dict[str, torch.Tensor]:
    plain = [sample.window for sample in batch if sample.window is not None]
    if len(plain) == len(batch):
        return window_batch(np.stack(plain))
    stacked = stack_samples(batch)
    if stacked is not None:
        return stacked
    # each key's values are tensors, which collate stacks into one tensor
    return {
        key: cast("torch.Tensor", collate([sample[key] for sample in batch], collate_fn_map=collate_fn_map))
        for key in batch[0]
    }


def window_batch(windows: np.ndarray) -> dict[str, torch.Tensor]:
    """``(B, seq_len + 1)`` windows as the batch: in a worker one that crosses to the main process compact."""
    if get_worker_info() is None:
        return windows_to_sample(windows)
    compact = windows.astype(np.uint16) if windows.min() >= 0 and windows.max() <= 0xFFFF else windows
    # the main process builds the int64 input_ids / labels from the compact windows (WindowBatch's pickle); here the
    # dict holds views of the windows, not copies nobody reads (they go as tensors only if the dict is changed)
    whole = torch.from_numpy(windows)
    return WindowBatch(compact, {"input_ids": whole[:, :-1], "labels": whole[:, 1:]})


default_collate_fn_map.setdefault(StreamSample, collate_samples)  # torch's documented registry
