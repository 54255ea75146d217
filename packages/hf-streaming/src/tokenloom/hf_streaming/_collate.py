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

import gc
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import get_worker_info
from torch.utils.data._utils.collate import collate, default_collate_fn_map

from tokenloom.datasets import WindowBatch, stack_samples, windows_to_sample
from tokenloom.formats import ConfigError

__all__ = ["StreamSample", "collate_samples", "stream_loader", "window_batch"]


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
    return WindowBatch(compact, windows_to_sample(windows))


def _as_is(item: Any) -> Any:
    return item


def stream_loader(
    dataset: Any, batch_size: int = 8, num_workers: int = 0, *, freeze_gc: bool = False, **kwargs: Any
) -> Any:
    """A torchdata ``StatefulDataLoader`` over ``dataset`` whose workers cut whole batches themselves.

    The same batches, in the same order, and the same states as ``StatefulDataLoader(dataset, batch_size,
    num_workers=num_workers, **kwargs)`` (every worker's last batch of a pass holds its remaining windows),
    without a sample object and a collate per window: the dataset yields batches of ``batch_size`` windows
    (a :class:`StreamingHuggingFaceDataset` so configured yields batches from then on, also without this
    loader). ``kwargs`` go to ``StatefulDataLoader`` (``snapshot_every_n_steps``, ``pin_memory``, ...).

    With workers and ``freeze_gc=True`` (off by default: it changes the whole process's collector, a choice for
    the training script, not a library), the objects alive now (torch's modules, the model built so far)
    move to the collector's permanent generation (``gc.freeze()``, Python's advice before forking workers):
    the workers' collections no longer walk (and copy) the parent's objects, and the interpreter's exit stops
    collecting them (torch's import alone: 0.7 -> 0.2 CPU-s at exit). Cycles among them that die later are not
    collected until ``gc.unfreeze()``.
    """
    from torchdata.stateful_dataloader import StatefulDataLoader

    from tokenloom.hf_streaming._dataset import StreamingHuggingFaceDataset

    if not isinstance(dataset, StreamingHuggingFaceDataset):
        raise ConfigError(
            f"stream_loader takes a StreamingHuggingFaceDataset, not a {type(dataset).__name__}",
            field="dataset",
            hint="Use torchdata's StatefulDataLoader(dataset, batch_size=...) for other datasets",
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size is {batch_size!r}, expected an integer >= 1", field="batch_size")
    dataset._batch_rows = batch_size
    loader = StatefulDataLoader(dataset, batch_size=None, num_workers=num_workers, collate_fn=_as_is, **kwargs)
    if freeze_gc and num_workers > 0:
        gc.freeze()
    return loader


default_collate_fn_map.setdefault(StreamSample, collate_samples)  # torch's documented registry
