"""PackedSFTDataset: whole conversations of an sft record store packed into sequences of seq_len tokens.

The plan is best-fit decreasing over every conversation's length (deterministic, computed once over the
whole store, :func:`best_fit_decreasing`); a conversation is never split, and one longer than seq_len is
left out and counted (``num_too_long``; pass ``too_long="error"`` to refuse instead). From the plan a
gather plan is built once as flat arrays (every sample's segments: its conversations, then its padding).
A batch is two slice copies per conversation into a compact form (the tokens in the store's dtype and the
loss mask, ``(B, L)`` each, and the segment lengths), expanded vectorised over the whole batch into the
samples :func:`~tokenloom.datasets._sample.build_batch` gives for these documents: ``input_ids``, ``labels``
(-100 where the store's ``loss_mask`` is 0, across conversation boundaries and on padding),
``position_ids`` restarting at every conversation, ``doc_ids`` and ``cu_seqlens`` (padding is one more
segment), all of length seq_len. A DataLoader worker sends the compact form (about 1/12 of the int64
tensors, inside the pickle: no shared-memory file per batch) and the main process expands it, as
:class:`~tokenloom.datasets._batch.WindowBatch` does for plain windows.
A negative id in a signed ``sequence`` is a TokenRangeError when a batch gathers it (unsigned stores
skip the check). ``packing_efficiency`` is the share of the packed slots that hold tokens (logged once).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset

from tokenloom.datasets._batch import SampleBatch
from tokenloom.datasets._binpack import best_fit_decreasing, pack_order
from tokenloom.datasets._sample import IGNORE_INDEX
from tokenloom.datasets._state import FingerprintState, settings_fingerprint
from tokenloom.datasets._window_index import check_positive
from tokenloom.formats import (
    ConfigError,
    FormatError,
    MissingKeyError,
    RecordStore,
    TokenRangeError,
    open_records,
)

__all__ = ["PackedSFTDataset"]

log = logging.getLogger("tokenloom.datasets")
_KEYS = ("input_ids", "labels", "position_ids", "doc_ids")


class PackedSFTDataset(FingerprintState, Dataset[dict[str, torch.Tensor]]):
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
                hint="Raise seq_len, pass too_long='skip' to leave them out (counted), or re-tokenize with --seq-len",
            )
        self.num_too_long = len(over)
        fits = np.where(lengths <= self.seq_len, lengths, 0)  # 0: best_fit_decreasing places it nowhere
        self._order, self._bin_offsets = pack_order(best_fit_decreasing(fits, self.seq_len), fits)
        self._plan(lengths)
        dtypes = [np.dtype(part.dtypes["sequence"]) for part in self.store.parts]
        self._token_dtype = dtypes[0] if len(set(dtypes)) == 1 else np.dtype(np.int64)
        self._signed = any(dtype.kind == "i" for dtype in dtypes)  # negative ids possible: checked per batch
        self._arrays: list[tuple[np.ndarray, np.ndarray]] | None = None
        self._arrays_pid = -1
        if len(self) == 0:
            raise ConfigError(
                f"no conversation fits in seq_len {self.seq_len}: the store holds {len(lengths)} records, "
                f"{self.num_too_long} of them longer",
                path=self.store.path,
                field="seq_len" if len(lengths) else None,
                hint="Raise seq_len or re-tokenize with --seq-len"
                if len(lengths)
                else "Tokenize conversations into the store (tokenloom tokenize --train-type sft)",
            )
        packed = int(fits.sum())
        self.packing_efficiency = packed / (len(self) * self.seq_len)
        log.info(
            "packed sft: %d conversations in %d sequences of %d tokens, packing efficiency %.1f%% "
            "(%d too long, left out)",
            len(self._order),
            len(self),
            self.seq_len,
            100 * self.packing_efficiency,
            self.num_too_long,
        )
        self._fingerprint = settings_fingerprint(  # the store's content, not where it lies: a moved store resumes
            lengths=hashlib.blake2b(lengths.tobytes(), digest_size=12).hexdigest(),
            dtypes=sorted(kinds),
            records=len(self.store),
            tokens=packed,
            seq_len=self.seq_len,
            pad_id=self.pad_id,
            mode="packed-sft",
        )

    def __len__(self) -> int:
        return len(self._bin_offsets) - 1

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

    def _plan(self, lengths: np.ndarray) -> None:
        """The gather plan, built once as flat arrays of segments: every sample's conversations, then its
        padding (one more segment, maybe empty), samples in order; sample i's segments are ``_seg_count[i]``
        from ``_seg_first[i]``. Per segment: ``_segments`` its store part (-1: padding), start in that part's
        arrays and length; ``_seg_number`` its number in its sample."""
        order, bins = self._order, len(self._bin_offsets) - 1
        counts = np.diff(self._bin_offsets)
        conversation = np.arange(len(order)) + np.repeat(np.arange(bins), counts)
        padding = self._bin_offsets[1:] + np.arange(bins)
        offsets = [np.asarray(part.offsets["sequence"], dtype=np.int64) for part in self.store.parts]
        part_of = np.repeat(np.arange(len(offsets)), [len(o) - 1 for o in offsets])
        self._segments = np.zeros((3, len(order) + bins), dtype=np.int64)  # part (-1: padding), begin, length
        self._segments[0, padding] = -1
        self._segments[:2, conversation] = part_of[order], np.concatenate([o[:-1] for o in offsets])[order]
        self._segments[2, conversation] = lengths[order]
        ends = np.concatenate([[0], np.cumsum(lengths[order])])
        self._segments[2, padding] = self.seq_len - (ends[self._bin_offsets[1:]] - ends[self._bin_offsets[:-1]])
        self._seg_first, self._seg_count = self._bin_offsets[:-1] + np.arange(bins), counts + 1
        self._seg_number = (np.arange(len(order) + bins) - np.repeat(self._seg_first, counts + 1)).astype(np.int32)

    def _gather(self, indices: Sequence[int]) -> _Compact:
        """The samples at ``indices`` in compact form (:class:`_Compact`).

        Two slice copies per conversation into ``(B, L)`` arrays (0 and untrained on padding), where the
        plan says; everything else is :meth:`_Compact.expand`'s, vectorised over the batch.
        """
        size = len(self)
        index = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(index) and not (-size <= index.min() and index.max() < size):
            bad = index[(index < -size) | (index >= size)]
            raise IndexError(f"sequence {int(bad[0])} out of range for {size} packed sequences")
        if len(index) and index.min() < 0:
            index = index % size  # a new array: never the caller's
        first, counts = self._seg_first[index], self._seg_count[index]
        ends = counts.cumsum()
        segments = (first + counts - ends).repeat(counts) + _arange(int(ends[-1]) if len(ends) else 0)
        plan = self._segments[:, segments]
        lengths = plan[2]
        starts = lengths.cumsum() - lengths  # a sample's segments fill its seq_len exactly
        tokens = np.zeros((len(index), self.seq_len), dtype=self._token_dtype)
        trained = np.zeros((len(index), self.seq_len), dtype=np.bool_)
        flat_tokens, flat_trained = tokens.reshape(-1), trained.reshape(-1)
        arrays = self._record_arrays()
        parts, begins, sizes = plan.tolist()
        for part, begin, start, count in zip(parts, begins, starts.tolist(), sizes, strict=True):
            if part >= 0:
                sequence, mask = arrays[part]
                flat_tokens[start : start + count] = sequence[begin : begin + count]
                flat_trained[start : start + count] = mask[begin : begin + count]
        if self._signed and len(tokens) and tokens.min() < 0:
            self._refuse_negative(flat_tokens, index, segments, starts)
        return _Compact(tokens, trained, lengths, self._seg_number[segments], self.pad_id)

    def _refuse_negative(
        self, flat_tokens: np.ndarray, index: np.ndarray, segments: np.ndarray, starts: np.ndarray
    ) -> None:
        """TokenRangeError at the first negative id of a gathered batch: its file, byte offset and record."""
        at = int(np.argmax(flat_tokens < 0))
        which = int(np.searchsorted(starts, at, side="right")) - 1
        segment, sample = int(segments[which]), int(index[at // self.seq_len])
        part = self.store.parts[int(self._segments[0, segment])]
        dtype = np.dtype(part.dtypes["sequence"])
        raise TokenRangeError(
            f"token id {int(flat_tokens[at])} is negative in the store's signed 'sequence' ({dtype.name}), "
            "expected token ids >= 0",
            path=part.files["sequence"],
            offset=(int(self._segments[1, segment]) + at - int(starts[which])) * dtype.itemsize,
            record=int(self._order[segment - sample]),
            field="sequence",
            hint="The store holds something other than a tokenizer's ids: re-create it "
            "(tokenloom tokenize --train-type sft) or fix the program that wrote it",
        )

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {key: value[0] for key, value in self._gather([index]).expand().items()}

    def __getitems__(self, indices: Sequence[int]) -> SampleBatch:
        compact = self._gather(indices)
        return SampleBatch.from_compact(compact.tokens, _Compact.expand, compact)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_arrays"], state["_arrays_pid"] = None, -1  # mapped again in the worker
        return state

    def __repr__(self) -> str:
        return (
            f"PackedSFTDataset(sequences={len(self)}, seq_len={self.seq_len}, "
            f"efficiency={self.packing_efficiency:.2%}, too_long={self.num_too_long})"
        )


class _Compact(NamedTuple):
    """A packed batch before :meth:`expand`: what a DataLoader worker sends (1/12 of the int64 batch, uint16 ids)."""

    tokens: np.ndarray  # (B, L) in the store's dtype, 0 on padding
    trained: np.ndarray  # (B, L) bool: the store's loss_mask, False on padding
    lengths: np.ndarray  # int32: every segment's length (row by row: its conversations, then its padding)
    numbers: np.ndarray  # int32: every segment's number in its row
    pad_id: int

    def expand(self) -> dict[str, torch.Tensor]:
        """The batch's tensors (int64 ``(B, L)``, ``cu_seqlens`` int32 ``(B, L + 1)``), vectorised over the batch.

        Labels are the next token where its loss_mask is 1, else -100, and -100 at every segment's end;
        position_ids count from 0 in every segment; doc_ids are segment numbers.
        """
        rows, length = self.tokens.shape
        wide, cu = np.empty((4, rows * length), dtype=np.int64), np.empty((rows, length + 1), dtype=np.int32)
        ids, labels, positions, docs = wide
        lengths, numbers = self.lengths, self.numbers
        ends = np.cumsum(lengths, dtype=np.int64)
        starts = ends - lengths
        np.copyto(ids, self.tokens.reshape(-1), casting="unsafe")
        if self.pad_id != 0:  # every row's last segment is its padding
            last = np.flatnonzero(np.append(numbers[1:] == 0, True))
            for start, end in zip(starts[last].tolist(), ends[last].tolist(), strict=True):
                ids[start:end] = self.pad_id
        np.copyto(labels[:-1], ids[1:])
        np.copyto(labels[:-1], IGNORE_INDEX, where=~self.trained.reshape(-1)[1:])
        labels[ends - 1] = IGNORE_INDEX  # no label across a conversation's end or a row's end (the last cell too)
        np.subtract(_arange(rows * length), starts.repeat(lengths), out=positions)
        np.copyto(docs, numbers.repeat(lengths))
        cu.fill(length)
        row = (ends - 1) // length
        cu[row, numbers] = starts - row * length
        out: dict[str, torch.Tensor] = dict(
            zip(_KEYS, torch.from_numpy(wide.reshape(4, rows, length)).unbind(), strict=True)
        )
        out["cu_seqlens"] = torch.from_numpy(cu)
        return out


def _arange(size: int) -> np.ndarray:
    global _ARANGE
    if len(_ARANGE) < size:
        _ARANGE = np.arange(size, dtype=np.int64)
    return _ARANGE[:size]


_ARANGE = np.arange(0, dtype=np.int64)
