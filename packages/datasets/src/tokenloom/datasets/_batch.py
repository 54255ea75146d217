"""Batched fetch for DataLoader: ``__getitems__`` results and the collate that keeps them batched.

``torch.utils.data.DataLoader`` calls ``dataset.__getitems__(indices)`` when a
dataset has it, then ``collate_fn`` on the result, then (with workers) pickles
the batch to the main process. What dominates that path is not building the
samples but moving them: every tensor storage crosses the process boundary as
its own shared-memory file and file-descriptor hand-over. So our datasets build
a whole batch in one vectorised call into **one** storage (shared memory inside
a worker) and return a :class:`SampleBatch`: a sequence of per-sample dicts (so
``default_collate`` still works) that carries the batched tensors.
:func:`collate` returns those tensors as they are; ``default_collate`` does the
same through the type registry torch documents for extending it, so both paths
send one storage per batch instead of one per key.

Plain windows go further (see :class:`WindowBatch`): a worker sends the batch's
``(B, L + 1)`` tokens in their storage dtype (uint16 for most vocabularies) inside
the pickle itself, and the main process widens them to the int64 ``input_ids`` and
``labels`` while unpickling. A shared-memory storage costs, per batch, a new
shared-memory file in the worker and a socket connection with an authentication
handshake to the worker's resource-sharer thread in the main process (that is
how torch passes the file descriptor); 33 kB of uint16 through the result pipe
cost less than that handshake alone. The training loop still receives a plain
dict of contiguous int64 tensors, and ``labels`` never shares memory with
``input_ids`` (editing labels in place cannot change the inputs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast, overload

import numpy as np
import torch
from torch.utils.data import default_collate, get_worker_info

__all__ = [
    "SampleBatch",
    "SampleRow",
    "WindowBatch",
    "batch_tensors",
    "collate",
    "empty_batch",
    "stack_samples",
    "windows_to_sample",
]

_ALIGN = 64  # bytes; every key starts on a cache line of the shared storage
#: a batch's compact form: ``expand(*args)`` gives its tensors (what a DataLoader worker sends)
Compact = tuple[Callable[..., dict[str, torch.Tensor]], tuple[Any, ...]]


class SampleRow(dict):
    """One sample of a :class:`SampleBatch`: row views of the batched tensors."""

    __slots__ = ()

    def __reduce__(self) -> Any:
        return (dict, (dict(self),))


class SampleBatch(Sequence[SampleRow]):
    """Per-sample dicts (built on demand, as row views) plus ``batched``: the same data as ``(B, ...)`` tensors.

    Built either from the batched tensors or from a compact form (``SampleBatch.from_compact``: the token rows in
    their storage dtype and how to expand them, e.g. plain windows, ``SampleBatch.from_windows``): then ``batched``
    is made on first use and the batch pickles as the compact form.
    """

    __slots__ = ("_batched", "_size", "compact", "windows")

    def __init__(self, batched: Mapping[str, torch.Tensor]) -> None:
        self._batched: dict[str, torch.Tensor] | None = dict(batched)
        self.windows: np.ndarray | None = None
        self.compact: Compact | None = None
        self._size = len(next(iter(batched.values()))) if batched else 0

    @classmethod
    def from_compact(
        cls, windows: np.ndarray, expand: Callable[..., dict[str, torch.Tensor]], *args: Any
    ) -> SampleBatch:
        """A batch of ``len(windows)`` samples whose tensors are ``expand(*args)``, made on first use; pickled (and
        sent from a DataLoader worker) as ``(expand, args)``."""
        batch = cls.__new__(cls)
        batch._batched, batch.windows, batch.compact, batch._size = None, windows, (expand, args), len(windows)
        return batch

    @classmethod
    def from_windows(cls, windows: np.ndarray, extras: Mapping[str, np.ndarray] | None = None) -> SampleBatch:
        """Plain language-model samples of ``(B, L + 1)`` windows (input_ids = [:, :-1], labels = [:, 1:]).

        ``extras``: small per-sample int64 arrays of shape ``(B,)`` carried beside them (e.g. a bucket id).
        """
        return cls.from_compact(windows, windows_to_sample, windows, dict(extras) if extras else None)

    @property
    def batched(self) -> dict[str, torch.Tensor]:
        if self._batched is None:
            expand, args = cast(Compact, self.compact)
            self._batched = expand(*args)
        return self._batched

    def __len__(self) -> int:
        return self._size

    @overload
    def __getitem__(self, index: int) -> SampleRow: ...
    @overload
    def __getitem__(self, index: slice) -> list[SampleRow]: ...
    def __getitem__(self, index: int | slice) -> SampleRow | list[SampleRow]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._size))]
        if not -self._size <= index < self._size:
            raise IndexError(f"row {index} out of range for a batch of {self._size}")
        return SampleRow((key, value[index]) for key, value in self.batched.items())

    def __iter__(self) -> Iterator[SampleRow]:
        return (self[i] for i in range(self._size))

    def collated(self) -> dict[str, torch.Tensor]:
        """What both collates return: ``batched``; in a DataLoader worker a :class:`WindowBatch` when it can be."""
        if self.compact is not None and get_worker_info() is not None:
            return WindowBatch(self.windows, self.batched, compact=self.compact)
        return self.batched

    def __reduce__(self) -> Any:
        if self.compact is not None:
            return (SampleBatch.from_compact, (self.windows, self.compact[0], *self.compact[1]))
        return (SampleBatch, (self.batched,))


def windows_to_sample(windows: np.ndarray, extras: Mapping[str, np.ndarray] | None = None) -> dict[str, torch.Tensor]:
    """``input_ids`` / ``labels`` as contiguous int64 ``(B, L)`` tensors from ``(B, L + 1)`` windows of any int dtype.

    Both are views of one new buffer, at disjoint places: labels never alias input_ids.
    """
    rows, width = windows.shape
    out = np.empty((2, rows, width - 1), dtype=np.int64)
    np.copyto(out[0], windows[:, :-1], casting="safe")
    np.copyto(out[1], windows[:, 1:], casting="safe")
    both = torch.from_numpy(out)
    sample = {"input_ids": both[0], "labels": both[1]}
    for key, value in (extras or {}).items():
        sample[key] = torch.from_numpy(np.array(value, dtype=np.int64))
    return sample


class WindowBatch(dict):
    """A collated compact batch inside a DataLoader worker: an ordinary dict of the int64 tensors.

    Pickled (to go to the main process) it is the compact windows, rebuilt there into a plain ``dict`` by
    :func:`windows_to_sample` (or by ``compact``: ``(expand, args)``), unless the dict was changed after collation
    (a key replaced, added or removed, or a tensor modified in place, which torch's version
    counter records): then the tensors themselves are sent, as for any dict. Writes through
    ``tensor.numpy()`` bypass that counter; a collate that edits the batch that way should
    build a new dict.
    """

    __slots__ = ("_versions", "compact")

    def __init__(
        self,
        windows: np.ndarray | None,
        tensors: Mapping[str, torch.Tensor],
        extras: Mapping[str, np.ndarray] | None = None,
        *,
        compact: Compact | None = None,
    ) -> None:
        super().__init__(tensors)
        self.compact = compact or (windows_to_sample, (windows, dict(extras) if extras else None))
        self._versions = {key: (id(value), value._version) for key, value in tensors.items()}

    def _unchanged(self) -> bool:
        if self.keys() != self._versions.keys():
            return False
        return all(
            isinstance(value, torch.Tensor) and (id(value), value._version) == self._versions[key]
            for key, value in self.items()
        )

    def __reduce__(self) -> Any:
        if self._unchanged():
            return self.compact
        return (dict, (dict(self),))


def empty_batch(layout: Mapping[str, tuple[tuple[int, ...], torch.dtype]]) -> dict[str, torch.Tensor]:
    """Uninitialised tensors of the given shapes and dtypes, all views of one storage.

    Inside a DataLoader worker the storage is shared memory, allocated once, so
    the batch crosses to the main process as one file descriptor and no copy
    (this is what ``default_collate`` does for each key; we do it once per batch).
    """
    offsets: dict[str, int] = {}
    nbytes = 0
    for key, (shape, dtype) in layout.items():
        offsets[key] = nbytes
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        nbytes += -(-size // _ALIGN) * _ALIGN
    if get_worker_info() is not None:
        storage = torch.UntypedStorage._new_shared(max(nbytes, 1))
    else:
        storage = torch.UntypedStorage(max(nbytes, 1))
    return {
        key: torch.empty(0, dtype=dtype).set_(storage, offsets[key] // dtype.itemsize, shape, _strides(shape))
        for key, (shape, dtype) in layout.items()
    }


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def batch_tensors(arrays: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """``arrays`` copied into tensors that share one storage (see :func:`empty_batch`)."""
    out = empty_batch(
        {key: (tuple(value.shape), torch.from_numpy(np.empty(0, value.dtype)).dtype) for key, value in arrays.items()}
    )
    for key, value in arrays.items():
        np.copyto(out[key].numpy(), value, casting="no")
    return out


def stack_samples(samples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor] | None:
    """Per-sample dicts of CPU tensors stacked into one storage; None if they are not all alike."""
    if not samples or not all(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in samples[0].values()):
        return None
    first = samples[0]
    for sample in samples:
        if sample.keys() != first.keys() or any(
            not isinstance(sample[k], torch.Tensor) or sample[k].shape != v.shape or sample[k].dtype != v.dtype
            for k, v in first.items()
        ):
            return None
    out = empty_batch({key: ((len(samples), *value.shape), value.dtype) for key, value in first.items()})
    for key, value in out.items():
        torch.stack([sample[key] for sample in samples], out=value)
    return out


def collate(batch: Sequence[Any]) -> Any:
    """``default_collate``, except that a :class:`SampleBatch` is returned as its batched tensors."""
    if isinstance(batch, SampleBatch):
        return batch.collated()
    return default_collate(list(batch))


def _collate_rows(batch: Sequence[SampleRow], *, collate_fn_map: dict[Any, Callable[..., Any]] | None = None) -> Any:
    if isinstance(batch, SampleBatch):
        return batch.collated()
    from torch.utils.data._utils.collate import collate as torch_collate

    return {key: torch_collate([row[key] for row in batch], collate_fn_map=collate_fn_map) for key in batch[0]}


def _register_with_default_collate() -> None:
    """torch's documented way to extend ``default_collate``: an entry in ``default_collate_fn_map``."""
    try:
        from torch.utils.data._utils.collate import default_collate_fn_map
    except ImportError:  # a torch without the registry: default_collate stacks the rows, still correct
        return
    default_collate_fn_map.setdefault(SampleRow, _collate_rows)


_register_with_default_collate()
