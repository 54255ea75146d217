"""Finite streams on many ranks: every rank takes the same number of steps, none hangs.

Why: ranks tokenize different documents, so a finite pass ends after a different
number of batches on each rank, and a rank that stops early leaves the others
blocked in the next gradient all-reduce (torchtitan refuses finite streams on
more than one rank for that reason). No rank can know another's count without
tokenizing its data, so the agreement is made as the pass goes: each step, one
all-reduce (MAX) of a 0/1 "I still have a batch" flag. While any rank has data,
every rank steps; a rank that ran out steps on a *padding batch* (EOS inputs,
every label -100, doc_index -1), which adds nothing to a token-weighted loss.
All ranks see the flag at 0 on the same step and stop together.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from tokenloom.formats import ConfigError

__all__ = ["FiniteStepper", "padding_batch"]

_IGNORE = -100


def padding_batch(
    template: dict[str, torch.Tensor] | None, *, batch_size: int, seq_len: int, eos_id: int, keys: Iterable[str]
) -> dict[str, torch.Tensor]:
    """A batch that trains on nothing: EOS inputs, labels -100, doc_ids 0, provenance -1."""
    shape = (batch_size, seq_len)
    if template is not None:
        shape = tuple(template["input_ids"].shape)
        keys = template.keys()
    batch: dict[str, torch.Tensor] = {}
    for key in keys:
        if key == "input_ids":
            batch[key] = torch.full(shape, eos_id, dtype=torch.int64)
        elif key == "labels":
            batch[key] = torch.full(shape, _IGNORE, dtype=torch.int64)
        elif key in ("doc_index", "label_doc_index"):
            batch[key] = torch.full(shape, -1, dtype=torch.int64)
        else:
            batch[key] = torch.zeros(shape, dtype=torch.int64)
    return batch


class FiniteStepper:
    """Iterate ``loader`` in lock-step with every other rank of ``group``.

    Yields ``(batch, real)``: ``real`` is False for padding batches of a rank that
    ran out. Use it for finite passes (``infinite=False``) on more than one rank::

        for batch, real in FiniteStepper(loader, seq_len=2048, eos_id=ds.eos_id):
            loss = model(batch)   # padding batches have every label -100

    ``steps`` and ``padded`` count what was yielded.
    """

    def __init__(
        self,
        loader: Iterable[dict[str, torch.Tensor]],
        *,
        seq_len: int,
        eos_id: int,
        batch_size: int | None = None,
        keys: Iterable[str] = ("input_ids", "labels"),
        group: Any = None,
        device: torch.device | str = "cpu",
    ) -> None:
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            raise ConfigError(
                "FiniteStepper needs torch.distributed initialised (it agrees on the last step with the other ranks)",
                field="group",
                hint="Call torch.distributed.init_process_group first; on one rank iterate the loader directly",
            )
        self.loader = loader
        self.seq_len = seq_len
        self.eos_id = eos_id
        self.batch_size = batch_size if batch_size is not None else int(getattr(loader, "batch_size", 1) or 1)
        self.keys = tuple(keys)
        self.group = group
        self.device = torch.device(device)
        self.steps = 0
        self.padded = 0

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], bool]]:
        iterator = iter(self.loader)
        template: dict[str, torch.Tensor] | None = None
        exhausted = False
        flag = torch.zeros(1, dtype=torch.int64, device=self.device)
        while True:
            batch = None
            if not exhausted:
                try:
                    batch = next(iterator)
                except StopIteration:
                    exhausted = True
            flag.fill_(0 if batch is None else 1)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self.group)
            if int(flag.item()) == 0:
                return
            self.steps += 1
            if batch is None:
                self.padded += 1
                yield (
                    padding_batch(
                        template, batch_size=self.batch_size, seq_len=self.seq_len, eos_id=self.eos_id, keys=self.keys
                    ),
                    False,
                )
            else:
                template = batch
                yield batch, True
