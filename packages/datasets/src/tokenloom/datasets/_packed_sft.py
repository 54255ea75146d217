"""PackedSFTDataset: whole conversations of an sft record store packed into sequences of seq_len tokens.

The plan is best-fit decreasing over every conversation's length (deterministic, computed once over the
whole store, :func:`best_fit_decreasing`); a conversation is never split, and one longer than seq_len is
left out and counted (``num_too_long``; pass ``too_long="error"`` to refuse instead). Each sample is
built by the one sample builder (:func:`build_batch`): ``input_ids``, ``labels`` (-100 where the store's
``loss_mask`` is 0, across conversation boundaries and on padding), ``position_ids`` restarting at every
conversation, ``doc_ids`` and ``cu_seqlens`` (padding is one more segment), all of length seq_len.
``packing_efficiency`` is the share of the packed slots that hold tokens (logged once).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from tokenloom.datasets._batch import SampleBatch, batch_tensors
from tokenloom.datasets._binpack import best_fit_decreasing, pack_order
from tokenloom.datasets._sample import build_batch, to_torch
from tokenloom.datasets._state import check_state, settings_fingerprint
from tokenloom.datasets._window_index import check_positive
from tokenloom.formats import ConfigError, MissingKeyError, RecordStore, open_records

__all__ = ["PackedSFTDataset"]

log = logging.getLogger("tokenloom.datasets")


class PackedSFTDataset(Dataset[dict[str, torch.Tensor]]):
    """Packed sft conversations (see the module docstring).

    Args:
        store: an sft record store (``sequence``, ``loss_mask``; written by tokenloom's post-training
            writer or AstrAI's ``save_bin`` with record offsets), or its path.
        seq_len: tokens per sample (L).
        pad_id: the padding token (never a label).
        too_long: "skip" (count conversations longer than seq_len and leave them out) or "error".
    """

    def __init__(
        self,
        store: RecordStore | str | os.PathLike[str],
        seq_len: int,
        *,
        pad_id: int = 0,
        too_long: str = "skip",
    ) -> None:
        self.seq_len = check_positive(seq_len, "seq_len")
        self.store = store if isinstance(store, RecordStore) else open_records(store)
        missing = [key for key in ("sequence", "loss_mask") if key not in self.store.keys]
        if missing:
            raise MissingKeyError(
                f"packed sft needs keys ['sequence', 'loss_mask'], missing {missing} (the store has {self.store.keys})",
                path=self.store.path,
            )
        if too_long not in ("skip", "error"):
            raise ConfigError(f"too_long {too_long!r}, expected 'skip' or 'error'", field="too_long")
        self.pad_id = int(pad_id)
        lengths = np.concatenate([np.diff(part.offsets["sequence"]) for part in self.store.parts]).astype(np.int64)
        over = np.flatnonzero(lengths > self.seq_len)
        if len(over) and too_long == "error":
            raise ConfigError(
                f"{len(over)} conversations are longer than seq_len {self.seq_len} (record {int(over[0])} has "
                f"{int(lengths[over[0]])} tokens)",
                path=self.store.path,
                record=int(over[0]),
                field="seq_len",
                hint="Raise seq_len, pass too_long='skip' to leave them out (counted), "
                "or re-tokenize with --max-length",
            )
        self.num_too_long = len(over)
        fits = np.where(lengths <= self.seq_len, lengths, 0)  # 0: best_fit_decreasing places it nowhere
        bin_of = best_fit_decreasing(fits, self.seq_len)
        self._order, self._bin_offsets = pack_order(bin_of, fits)
        self._lengths = fits
        if len(self) == 0:
            raise ConfigError(
                f"no conversation fits in seq_len {self.seq_len} ({len(lengths)} records)", path=self.store.path
            )
        packed = int(fits.sum())
        self.packing_efficiency = packed / (len(self) * self.seq_len)
        log.info(
            "packed sft: %d conversations in %d sequences of %d tokens, packing efficiency %.1f%% "
            "(%d too long, left out)",
            int((fits > 0).sum()),
            len(self),
            self.seq_len,
            100 * self.packing_efficiency,
            self.num_too_long,
        )
        self._fingerprint = settings_fingerprint(
            store=str(self.store.path),
            records=len(self.store),
            tokens=packed,
            seq_len=self.seq_len,
            pad_id=self.pad_id,
            mode="packed-sft",
        )

    def __len__(self) -> int:
        return len(self._bin_offsets) - 1

    def fingerprint(self) -> str:
        return self._fingerprint

    def conversations(self, index: int) -> list[int]:
        """The store records packed into sample ``index``, in order."""
        first, last = int(self._bin_offsets[index]), int(self._bin_offsets[index + 1])
        return self._order[first:last].tolist()

    def _batch(self, indices: Sequence[int]) -> dict[str, np.ndarray]:
        size = len(self)
        width = self.seq_len + 1  # one trailing pad so labels line up with input_ids
        tokens = np.full((len(indices), width), self.pad_id, dtype=np.int64)
        doc_ids = np.empty((len(indices), width), dtype=np.int64)
        ignore = np.ones((len(indices), width), dtype=bool)
        for row, index in enumerate(indices):
            if not -size <= index < size:
                raise IndexError(f"sequence {index} out of range for {size} packed sequences")
            position = 0
            records = self.conversations(index % size)
            for number, record in enumerate(records):
                arrays = self.store.record(record, ("sequence", "loss_mask"))
                sequence, mask = np.asarray(arrays["sequence"]), np.asarray(arrays["loss_mask"])
                end = position + len(sequence)
                tokens[row, position:end] = sequence
                ignore[row, position:end] = mask == 0
                doc_ids[row, position:end] = number
                position = end
            doc_ids[row, position:] = len(records)
        return build_batch(
            tokens, doc_ids=doc_ids, label_ignore=ignore, packing="documents", position_ids=True, cu_seqlens=True
        )

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return to_torch({key: value[0] for key, value in self._batch([index]).items()})

    def __getitems__(self, indices: Sequence[int]) -> SampleBatch:
        return SampleBatch(batch_tensors(self._batch(list(indices))))

    def state_dict(self) -> dict[str, Any]:
        return {"fingerprint": self._fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, fingerprint=self._fingerprint, owner="PackedSFTDataset")

    def __repr__(self) -> str:
        return (
            f"PackedSFTDataset(sequences={len(self)}, seq_len={self.seq_len}, "
            f"efficiency={self.packing_efficiency:.2%}, too_long={self.num_too_long})"
        )
