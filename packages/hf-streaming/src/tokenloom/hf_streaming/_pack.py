"""Documents -> seq_len + 1 token windows, each with the stream position after it.

Documents arrive in blocks with their position (epoch, item, row, hint) and the
number of leading tokens already consumed (``first_token``, non-zero only for a
document a resume starts inside). A block is encoded in one batched call, EOS
appended to every document, and concatenated after the carry-over of the
previous block; whole windows are cut with numpy, never per token. The position
after a window is the document holding its last token and the token offset
after it, so a resume re-encodes that document and drops what was emitted: the
carry-over is saved as references, not tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from tokenloom.formats import ResumeMismatchError
from tokenloom.hf_streaming._encode import EncodeFn

__all__ = ["DocBlock", "Packer", "Window", "joined", "rebatch"]


@dataclass(slots=True)
class DocBlock:
    """Documents in stream order; position columns are int64 arrays of one length."""

    texts: list[str]
    doc_ids: np.ndarray
    epoch: np.ndarray
    item: np.ndarray
    row: np.ndarray
    hint: np.ndarray
    first_token: np.ndarray


@dataclass(slots=True)
class Window:
    tokens: np.ndarray
    """(n, seq_len + 1) int64 windows."""
    ordinals: np.ndarray | None
    """(n, seq_len + 1) running document number of every token (padding: its own number); None: not kept."""
    provenance: np.ndarray | None
    """(n, seq_len + 1) source doc_id of every token (-1 for padding); None: not kept."""
    positions: np.ndarray
    """(n, 5) epoch, item, row, token offset, hint after each window."""
    padding: np.ndarray | None = None
    """(n, seq_len + 1) bool, True on padding (the last window of a finite stream)."""


class Packer:
    """Carry-over buffer and window cutter for one slot.

    Each block is written once, straight after the carry-over, into a fresh buffer (windows already yielded keep
    theirs); document numbers and provenance per token are built only when asked for (``ordinals``, ``provenance``).
    """

    def __init__(
        self,
        encode: EncodeFn,
        *,
        eos_id: int,
        seq_len: int,
        skip_empty: bool = False,
        ordinals: bool = True,
        provenance: bool = True,
    ) -> None:
        self.encode = encode
        self.eos_id = eos_id
        self.width = seq_len + 1
        self.skip_empty = skip_empty
        self.next_ordinal = 0
        self.documents = 0
        self._tokens = np.empty(0, dtype=np.int64)
        self._ordinals = np.empty(0, dtype=np.int64) if ordinals else None
        self._provenance = np.empty(0, dtype=np.int64) if provenance else None
        # per document in the buffer: end offset (buffer coordinates) and its position columns
        self._ends = np.empty(0, dtype=np.int64)
        self._doc_pos = np.empty((0, 5), dtype=np.int64)  # epoch, item, row, first_token - start, hint

    def add(self, block: DocBlock) -> None:
        if not block.texts:
            return
        flat, lengths = self.encode(block.texts)
        sizes = lengths + 1  # every document ends with EOS
        skip = block.first_token
        beyond = np.flatnonzero(skip > sizes)
        if beyond.size:
            k = int(beyond[0])
            raise ResumeMismatchError(
                f"the saved position is past the data: token offset {int(skip[k])} inside document "
                f"{int(block.doc_ids[k])}, which has {int(sizes[k])} tokens with its EOS",
                field="current",
                hint="Resume with the data files and tokenizer the state was saved with, or start afresh",
            )
        kept_sizes = sizes - skip
        if self.skip_empty:
            kept_sizes[lengths == 0] = 0
        carry = self._tokens.size
        ends = np.cumsum(sizes)  # in the block's own tokens (EOS included)
        if (kept_sizes == sizes).all():  # every token of every document (a resume or compat mode cuts some)
            tokens = np.empty(carry + int(ends[-1]), dtype=np.int64)
            tokens[:carry] = self._tokens
            body = tokens[carry:]
            is_eos = np.zeros(body.size, dtype=bool)
            is_eos[ends - 1] = True
            body[ends - 1] = self.eos_id
            body[~is_eos] = flat
        else:
            whole = np.empty(int(ends[-1]), dtype=np.int64)
            is_eos = np.zeros(whole.size, dtype=bool)
            is_eos[ends - 1] = True
            whole[ends - 1] = self.eos_id
            whole[~is_eos] = flat
            mask = np.ones(whole.size, dtype=bool)
            for index in np.flatnonzero(kept_sizes < sizes):
                mask[ends[index] - sizes[index] : ends[index] - kept_sizes[index]] = False
            tokens = np.concatenate([self._tokens, whole[mask]])
        ordinals = self.next_ordinal + np.arange(len(sizes), dtype=np.int64)
        self.next_ordinal += len(sizes)
        self.documents += len(sizes) - (int((lengths == 0).sum()) if self.skip_empty else 0)
        self._tokens = tokens
        if self._ordinals is not None:
            self._ordinals = np.concatenate([self._ordinals, np.repeat(ordinals, kept_sizes)])
        if self._provenance is not None:
            self._provenance = np.concatenate([self._provenance, np.repeat(block.doc_ids, kept_sizes)])
        present = kept_sizes > 0
        buffer_ends = carry + np.cumsum(kept_sizes)
        # token offset after X buffer tokens of document j = X - (end_j - kept_j) + skip_j = X - end_j + size_j
        columns = np.stack([block.epoch, block.item, block.row, sizes - buffer_ends, block.hint], axis=1)[present]
        self._ends = np.concatenate([self._ends, buffer_ends[present]])
        self._doc_pos = np.concatenate([self._doc_pos, columns])

    @property
    def buffered(self) -> int:
        return int(self._tokens.size)

    def windows(self, multiple: int = 1) -> Window | None:
        """The whole windows the buffer holds, rounded down to a ``multiple`` of rows (a batch), or None."""
        count = self._tokens.size // self.width // multiple * multiple
        if count == 0:
            return None
        used = count * self.width
        cut = np.arange(1, count + 1, dtype=np.int64) * self.width
        window = Window(
            tokens=self._tokens[:used].reshape(count, self.width),
            ordinals=_rows(self._ordinals, used, self.width),
            provenance=_rows(self._provenance, used, self.width),
            positions=self._positions(cut),
        )
        self._drop(used)
        return window

    def tail(self) -> Window | None:
        """The last, partial window padded with EOS (padding marked), or None if the buffer is empty."""
        size = self._tokens.size
        if size == 0:
            return None
        pad = self.width - size
        padding = np.zeros((1, self.width), dtype=bool)
        padding[0, size:] = True

        def padded(values: np.ndarray | None, fill: int) -> np.ndarray | None:
            return None if values is None else np.concatenate([values, np.full(pad, fill, dtype=np.int64)])[None, :]

        window = Window(
            tokens=padded(self._tokens, self.eos_id),  # type: ignore[arg-type] (never None)
            ordinals=padded(self._ordinals, int(self._ordinals[-1]) + 1 if self._ordinals is not None else 0),
            provenance=padded(self._provenance, -1),
            positions=self._positions(np.array([size], dtype=np.int64)),
            padding=padding,
        )
        self._drop(size)
        return window

    def _positions(self, cut: np.ndarray) -> np.ndarray:
        doc = np.searchsorted(self._ends, cut, side="left")
        columns = self._doc_pos[doc].copy()
        columns[:, 3] += cut  # token offset inside the document after the cut
        return columns

    def _drop(self, used: int) -> None:
        self._tokens = self._tokens[used:]
        if self._ordinals is not None:
            self._ordinals = self._ordinals[used:]
        if self._provenance is not None:
            self._provenance = self._provenance[used:]
        first = int(np.searchsorted(self._ends, used, side="right"))
        self._ends = self._ends[first:] - used
        self._doc_pos = self._doc_pos[first:].copy()
        self._doc_pos[:, 3] += used

    def clear(self) -> None:
        self._drop(self._tokens.size)


def joined(first: Window | None, last: Window | None) -> Window | None:
    """The rows of ``first`` then those of ``last`` as one window (either may be None)."""
    if first is None or last is None:
        return first or last

    def both(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
        return None if a is None or b is None else np.concatenate([a, b])

    pads = [np.zeros(w.tokens.shape, dtype=bool) if w.padding is None else w.padding for w in (first, last)]
    padding = None if first.padding is None and last.padding is None else np.concatenate(pads)
    return Window(
        tokens=np.concatenate([first.tokens, last.tokens]),
        ordinals=both(first.ordinals, last.ordinals),
        provenance=both(first.provenance, last.provenance),
        positions=np.concatenate([first.positions, last.positions]),
        padding=padding,
    )


def _rows(values: np.ndarray | None, used: int, width: int) -> np.ndarray | None:
    return None if values is None else values[:used].reshape(-1, width)


def rebatch(blocks: Iterable[DocBlock], size: int) -> Iterator[DocBlock]:
    """Split large reader blocks so one tokenizer call holds at most ``size`` documents."""
    for block in blocks:
        count = len(block.texts)
        if count <= size:
            yield block
            continue
        for begin in range(0, count, size):
            end = min(begin + size, count)
            yield type(block)(
                texts=block.texts[begin:end],
                doc_ids=block.doc_ids[begin:end],
                epoch=block.epoch[begin:end],
                item=block.item[begin:end],
                row=block.row[begin:end],
                hint=block.hint[begin:end],
                first_token=block.first_token[begin:end],
            )
