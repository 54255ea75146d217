"""Exact evaluation: samples with the training masks, and a loss that does not depend on the world size."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from tokenloom.datasets import build_batch, to_torch
from tokenloom.eval_broadcast._rows import EvalSet
from tokenloom.formats import ConfigError

__all__ = ["EvalDataset", "token_weighted_mean"]

log = logging.getLogger("tokenloom.eval_broadcast")


class EvalDataset(Dataset[dict[str, torch.Tensor]]):
    """Rows of ``seq_len + 1`` tokens -> the training sample dicts (tokenloom.datasets' one sample builder).

    Args:
        rows: an :class:`EvalSet` (or the share ``evalset.split(rank, world)``), or a 2-D array / tensor.
        pack_sequences: False, True (documents: doc_ids from EOS, labels -100 across documents) or
            "gpt-simple", as for training.
        eos_id: the EOS id for document packing; defaults to the EvalSet's.
        position_ids, cu_seqlens: as for tokenloom.datasets.MemoryMappedDataset.

    The last row's padding (an EvalSet's ``tail_padding``) never becomes a label, so the labels
    that are not -100 over all rows are exactly the set's real next-token predictions.
    """

    def __init__(
        self,
        rows: EvalSet | Any,
        *,
        pack_sequences: bool | str = False,
        eos_id: int | None = None,
        position_ids: bool = False,
        cu_seqlens: bool = False,
    ) -> None:
        tail_padding = 0
        if isinstance(rows, EvalSet):
            eos_id = rows.eos_id if eos_id is None else eos_id
            tail_padding = rows.tail_padding
            rows = rows.rows
        array = rows.numpy() if isinstance(rows, torch.Tensor) else np.asarray(rows)
        if array.ndim != 2 or array.shape[1] < 2 or array.dtype.kind not in "iu":
            raise ConfigError(
                f"rows of shape {array.shape} and dtype {array.dtype}, expected 2-D integer rows of >= 2 tokens",
                field="rows",
            )
        self.rows = array
        self.tail_padding = tail_padding
        self.options: dict[str, Any] = {
            "eos_id": eos_id,
            "packing": pack_sequences,
            "position_ids": position_ids,
            "cu_seqlens": cu_seqlens,
        }
        build_batch(array[:0], **self.options)  # bad options fail here, not in a worker

    def __len__(self) -> int:
        return len(self.rows)

    def _ignore(self, indices: np.ndarray) -> np.ndarray | None:
        if not self.tail_padding:
            return None
        ignore = np.zeros((len(indices), self.rows.shape[1]), dtype=bool)
        ignore[indices == len(self.rows) - 1, -self.tail_padding :] = True
        return ignore

    def batch(self, indices: Any) -> dict[str, torch.Tensor]:
        """Samples ``indices`` as one batched dict of ``(B, L)`` tensors."""
        indices = np.asarray(indices, dtype=np.int64)
        sample = build_batch(self.rows[indices], label_ignore=self._ignore(indices), **self.options)
        return to_torch(sample)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"row {index} out of range for {len(self)} rows")
        return {key: value[0] for key, value in self.batch([index % len(self)]).items()}

    def num_label_tokens(self) -> int:
        """Labels that count (not -100) over all rows."""
        if len(self) == 0:
            return 0
        return int((self.batch(np.arange(len(self)))["labels"] != -100).sum())


def token_weighted_mean(loss_sum: Any, token_count: Any, group: Any = None) -> torch.Tensor:
    """``sum(loss_sum) / sum(token_count)`` over the ranks of ``group`` (float64).

    ``loss_sum`` is this rank's summed per-token loss (``cross_entropy(..., reduction="sum")``),
    ``token_count`` its number of counted labels. The result is the same on 1, 2 or 3 ranks (within
    float rounding), unlike a mean of per-rank batch means. No tokens anywhere gives NaN (logged).
    """
    device = loss_sum.device if isinstance(loss_sum, torch.Tensor) else torch.device("cpu")
    total = torch.stack(
        [
            torch.as_tensor(loss_sum, dtype=torch.float64, device=device).reshape(()),
            torch.as_tensor(token_count, dtype=torch.float64, device=device).reshape(()),
        ]
    )
    if dist.is_available() and dist.is_initialized():
        if dist.get_backend(group) == "nccl" and device.type != "cuda":
            total = total.cuda()
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    if total[1] == 0:
        log.warning("token_weighted_mean: no tokens on any rank; the eval loss is NaN")
        return torch.tensor(float("nan"), dtype=torch.float64)
    return total[0] / total[1]
