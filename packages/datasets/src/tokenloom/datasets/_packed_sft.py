"""PackedSFTDataset: whole conversations of an sft record store packed into sequences of seq_len tokens.

The plan is best-fit decreasing over every conversation's length (deterministic, computed once over the
whole store, :func:`best_fit_decreasing`); a conversation is never split, and one longer than seq_len is
left out and counted (``num_too_long``; pass ``too_long="error"`` to refuse instead). A batch is filled
slice by slice per conversation straight into one shared storage (the samples
:func:`~tokenloom.datasets._sample.build_batch` gives for these documents): ``input_ids``, ``labels``
(-100 where the store's ``loss_mask`` is 0, across conversation boundaries and on padding),
``position_ids`` restarting at every conversation, ``doc_ids`` and ``cu_seqlens`` (padding is one more
segment), all of length seq_len.
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

from tokenloom.datasets._batch import SampleBatch, empty_batch
from tokenloom.datasets._binpack import best_fit_decreasing, pack_order
from tokenloom.datasets._sample import IGNORE_INDEX
from tokenloom.datasets._state import check_state, settings_fingerprint
from tokenloom.datasets._window_index import check_positive
from tokenloom.formats import ConfigError, FormatError, MissingKeyError, RecordStore, open_records

__all__ = ["PackedSFTDataset"]

log = logging.getLogger("tokenloom.datasets")
_KEYS = ("input_ids", "labels", "position_ids", "doc_ids")


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
        kinds = {np.dtype(part.dtypes["sequence"]).name for part in self.store.parts}
        if any(np.dtype(kind).kind not in "iu" for kind in kinds):
            raise FormatError(
                f"packed sft reads 'sequence' as token ids, but the store's sequence is {sorted(kinds)}",
                path=self.store.path,
                field="sequence",
                hint="Re-create the store with integer token ids (uint16, uint32, int32 or int64)",
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
        # per record: its store part and its span in that part's arrays
        offsets = [np.asarray(part.offsets["sequence"], dtype=np.int64) for part in self.store.parts]
        self._part_of = np.repeat(np.arange(len(offsets), dtype=np.int64), [len(o) - 1 for o in offsets])
        self._begin = np.concatenate([o[:-1] for o in offsets])
        self._end = np.concatenate([o[1:] for o in offsets])
        self._flat_columns = np.arange(self.seq_len * 8, dtype=np.int64)  # grown for larger batches
        self._arrays: list[tuple[np.ndarray, np.ndarray]] | None = None
        self._arrays_pid = -1
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

    def _record_arrays(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per store part: its ``sequence`` and ``loss_mask`` arrays (mapped once per process)."""
        if self._arrays is None or self._arrays_pid != os.getpid():
            self._arrays = [(part.array("sequence"), part.array("loss_mask")) for part in self.store.parts]
            self._arrays_pid = os.getpid()
        return self._arrays

    def _batch_into(self, indices: Sequence[int], out: dict[str, torch.Tensor]) -> None:
        """Fill ``out`` (tensors of shape ``(B, L)``, ``cu_seqlens`` ``(B, L + 1)``) with the samples at ``indices``.

        Two slice copies per conversation (tokens, loss mask); the rest vectorised over the batch: labels the
        next token where its loss_mask is 1 and it is in the same conversation, else -100; position_ids from 0
        per conversation (the padding is one more segment); doc_ids; cu_seqlens padded with L.
        """
        size, length = len(self), self.seq_len
        if len(indices) * length > len(self._flat_columns):
            self._flat_columns = np.arange(len(indices) * length, dtype=np.int64)
        arrays = self._record_arrays()
        ids, labels, positions = out["input_ids"].numpy(), out["labels"].numpy(), out["position_ids"].numpy()
        docs, cu = out["doc_ids"].numpy(), out["cu_seqlens"].numpy()
        trained = np.zeros(ids.shape, dtype=bool)
        ids.fill(self.pad_id)
        cu.fill(length)
        # segments (the conversations, then each row's padding), row-major: start in the flat batch, length, number
        flat_start: list[int] = []
        seg_len: list[int] = []
        seg_num: list[int] = []
        for row, index in enumerate(indices):
            if not -size <= index < size:
                raise IndexError(f"sequence {index} out of range for {size} packed sequences")
            index %= size
            records = self._order[self._bin_offsets[index] : self._bin_offsets[index + 1]]
            at = number = 0
            for part, begin, end in zip(
                self._part_of[records].tolist(), self._begin[records].tolist(), self._end[records].tolist(), strict=True
            ):
                sequence, mask = arrays[part]
                stop = at + end - begin
                ids[row, at:stop] = sequence[begin:end]
                trained[row, at:stop] = mask[begin:end]
                cu[row, number] = at
                flat_start.append(row * length + at)
                seg_len.append(stop - at)
                seg_num.append(number)
                at, number = stop, number + 1
            if at < length:  # the padding: one more segment
                cu[row, number] = at
                flat_start.append(row * length + at)
                seg_len.append(length - at)
                seg_num.append(number)
        starts = np.asarray(flat_start, dtype=np.int64)
        docs.reshape(-1)[:] = np.repeat(seg_num, seg_len)
        positions.reshape(-1)[:] = self._flat_columns[: docs.size] - np.repeat(starts, seg_len)
        flat_labels, flat_ids = labels.reshape(-1), ids.reshape(-1)
        np.copyto(flat_labels[:-1], np.where(trained.reshape(-1)[1:], flat_ids[1:], IGNORE_INDEX))
        flat_labels[starts + np.asarray(seg_len) - 1] = IGNORE_INDEX  # no label across a boundary or a row's end

    def _batch(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        rows = len(indices)
        layout = {key: ((rows, self.seq_len), torch.int64) for key in _KEYS}
        layout["cu_seqlens"] = ((rows, self.seq_len + 1), torch.int32)
        out = empty_batch(layout)
        self._batch_into(indices, out)
        return out

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {key: value[0] for key, value in self._batch([index]).items()}

    def __getitems__(self, indices: Sequence[int]) -> SampleBatch:
        return SampleBatch(self._batch(list(indices)))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_arrays"], state["_arrays_pid"] = None, -1  # mapped again in the worker
        return state

    def state_dict(self) -> dict[str, Any]:
        return {"fingerprint": self._fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, fingerprint=self._fingerprint, owner="PackedSFTDataset")

    def __repr__(self) -> str:
        return (
            f"PackedSFTDataset(sequences={len(self)}, seq_len={self.seq_len}, "
            f"efficiency={self.packing_efficiency:.2%}, too_long={self.num_too_long})"
        )
