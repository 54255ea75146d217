"""What ``build()`` returns -> validated rows of ``seq_len + 1`` tokens in the narrowest dtype.

Accepted: a 2-D array or tensor of rows, a 1-D token stream (cut into rows), a
:class:`tokenloom.formats.TokenDataset` (its token stream), or :class:`EvalTokens`
(any of those plus the EOS id and vocabulary size). A stream whose length is not
a multiple of the row length keeps its remainder as a last row padded at the end
(the padding is masked by :class:`~tokenloom.eval_broadcast.EvalDataset`), or
drops it with ``drop_remainder=True``; either way it is logged, never silent.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from tokenloom.formats import ConfigError, TokenDataset, TokenRangeError
from tokenloom.formats.io import smallest_dtype_for_vocab

if TYPE_CHECKING:  # rows are tensors, but checking a cache (tokenloom eval-cache) needs no torch
    import torch

__all__ = ["EvalSet", "EvalTokens", "exact_eval_split", "rows_checksum", "to_rows"]

log = logging.getLogger("tokenloom.eval_broadcast")

#: dtype codes of the wire header (and of the cache); never reuse a number.
DTYPE_CODES: dict[str, int] = {"uint16": 1, "uint32": 2, "int64": 3}
CODE_DTYPES: dict[int, np.dtype] = {code: np.dtype(name).newbyteorder("<") for name, code in DTYPE_CODES.items()}


@dataclass(frozen=True, slots=True)
class EvalTokens:
    """What a source's ``build()`` may return when it knows more than the ids."""

    tokens: Any
    """A 2-D array of rows, a 1-D token stream or a TokenDataset."""
    eos_id: int | None = None
    """The end-of-document id (for document masks in :class:`EvalDataset`)."""
    vocab_size: int | None = None
    """Every id must be below it; it also picks the wire dtype (uint16 up to 65,536)."""


@dataclass(frozen=True, slots=True)
class EvalSet:
    """The eval set every rank holds: ``rows`` of ``row_len`` tokens, padding only at the end of the last row."""

    rows: torch.Tensor
    """(num_rows, row_len) token ids, uint16 / uint32 (int64 only for vocabularies beyond 2**32)."""
    tail_padding: int = 0
    """Padding tokens at the end of the last row (0 when the last row is full)."""
    eos_id: int | None = None
    vocab_size: int | None = None
    origin: str = "built"
    """"built" (ran build here), "cache" (read from the cache), "received" (broadcast), "mapped" (memory-mapped)."""
    cache_path: str | None = field(default=None)

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    @property
    def row_len(self) -> int:
        return int(self.rows.shape[1])

    @property
    def num_tokens(self) -> int:
        """Real (unpadded) tokens."""
        return int(self.rows.numel()) - self.tail_padding

    def numpy(self) -> np.ndarray:
        return self.rows.numpy()

    def checksum(self) -> int:
        """xxh3-64 of the rows' bytes (what the header carries)."""
        return rows_checksum(self.numpy())

    def select(self, begin: int, end: int) -> EvalSet:
        """Rows ``[begin, end)``; the padding stays with the last row."""
        if not 0 <= begin <= end <= len(self):
            raise ConfigError(f"rows [{begin}, {end}) outside [0, {len(self)}]", field="rows")
        padding = self.tail_padding if end == len(self) and end > begin else 0
        return replace(self, rows=self.rows[begin:end], tail_padding=padding)

    def split(self, rank: int, world_size: int) -> EvalSet:
        """This rank's contiguous share (:func:`exact_eval_split`)."""
        return self.select(*exact_eval_split(len(self), rank, world_size))


def exact_eval_split(num_rows: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous rows ``[begin, end)``: every row on exactly one rank, shares differ by <= 1."""
    for name, value in (("num_rows", num_rows), ("rank", rank), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise ConfigError(f"{name}={value!r}, expected an int", field=name)
    if num_rows < 0:
        raise ConfigError(f"num_rows is {num_rows}, expected >= 0", field="num_rows")
    if world_size < 1:
        raise ConfigError(f"world_size is {world_size}, expected >= 1", field="world_size")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is outside [0, {world_size})", field="rank")
    return num_rows * rank // world_size, num_rows * (rank + 1) // world_size


def rows_checksum(rows: np.ndarray) -> int:
    """xxh3-64 of a C-contiguous array's bytes, as an unsigned int."""
    return xxhash.xxh3_64_intdigest(np.ascontiguousarray(rows).reshape(-1).view(np.uint8).data)


def _as_integer_array(value: Any) -> np.ndarray:
    torch = sys.modules.get("torch")  # a tensor exists only if torch is imported
    if torch is not None and isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if value is None:
        raise ConfigError("build() returned None, expected token ids (rows, a stream or a dataset)", field="build")
    array = np.asarray(value)
    if array.dtype == np.bool_ or array.dtype.kind not in "iu":
        if array.size == 0 and array.dtype.kind == "f":  # np.asarray([]) is float64: an empty set
            return array.astype(np.int64)
        raise ConfigError(
            f"build() returned dtype {array.dtype}, expected integer token ids",
            field="build",
            hint="Return an integer array (uint16 / uint32 / int64), a TokenDataset or EvalTokens",
        )
    return array


def to_rows(
    built: Any,
    *,
    seq_len: int | None,
    vocab_size: int | None = None,
    eos_id: int | None = None,
    drop_remainder: bool = False,
) -> tuple[np.ndarray, int, int | None, int | None]:
    """``(rows, tail_padding, eos_id, vocab_size)`` from whatever ``build()`` returned."""
    if isinstance(built, EvalTokens):
        eos_id = built.eos_id if eos_id is None else eos_id
        vocab_size = built.vocab_size if vocab_size is None else vocab_size
        built = built.tokens
    if isinstance(built, TokenDataset):
        if built.num_tokens and int(built.overlap_prefix.max(initial=0)) > 0:
            raise ConfigError(
                "the dataset's entries carry overlap prefixes (windowed long documents): their repeated tokens "
                "would be evaluated twice",
                path=built.root,
                hint="Tokenize the eval set without windowing (no --window-overlap)",
            )
        eos_id = built.eos_id if eos_id is None else eos_id
        vocab_size = built.vocab_size if vocab_size is None else vocab_size
        built = built.tokens(0, built.num_tokens)
    array = _as_integer_array(built)
    row_len = None if seq_len is None else seq_len + 1
    if array.ndim == 2:
        if row_len is not None and array.shape[1] != row_len:
            raise ConfigError(
                f"build() returned rows of {array.shape[1]} tokens, expected seq_len + 1 = {row_len}",
                field="build",
                hint="Cut rows of seq_len + 1 tokens, or return the 1-D stream and let this package cut it",
            )
        if array.shape[1] < 2:
            raise ConfigError(f"rows of {array.shape[1]} tokens, expected >= 2 (input + label)", field="build")
        stream, cut_len = array, 0
    elif array.ndim == 1:
        if row_len is None:
            raise ConfigError("build() returned a 1-D token stream and seq_len is None", field="seq_len")
        stream, cut_len = array, row_len
    else:
        raise ConfigError(
            f"build() returned a {array.ndim}-D array of shape {array.shape}, expected 2-D rows or a 1-D stream",
            field="build",
        )
    _check_range(stream, vocab_size)
    if vocab_size is not None and vocab_size < 1:
        raise ConfigError(f"vocab_size is {vocab_size}, expected >= 1", field="vocab_size")
    if eos_id is not None and not (eos_id >= 0 and (vocab_size is None or eos_id < vocab_size)):
        raise ConfigError(f"eos_id {eos_id} is outside the vocabulary of {vocab_size}", field="eos_id")
    width_for = vocab_size if vocab_size is not None else (int(stream.max()) + 1 if stream.size else 1)
    dtype = smallest_dtype_for_vocab(width_for)
    if cut_len:
        rows, tail_padding = _cut(stream.astype(dtype, copy=False), cut_len, eos_id, drop_remainder)
    else:
        rows, tail_padding = np.ascontiguousarray(stream, dtype=dtype), 0
    if len(rows) == 0:
        log.warning("the eval set has 0 rows (%d tokens for rows of %d)", stream.size, row_len or 0)
    return rows, tail_padding, eos_id, vocab_size


def _check_range(tokens: np.ndarray, vocab_size: int | None) -> None:
    if tokens.size == 0:
        return
    if tokens.dtype.kind == "i":
        low = int(tokens.min())
        if low < 0:
            where = int(np.argmax(tokens.reshape(-1) < 0))
            raise TokenRangeError(f"token id {low} is negative (first at flat position {where})", field="build")
    if vocab_size is not None:
        if vocab_size < 1:
            raise TokenRangeError(f"vocab_size is {vocab_size}, expected >= 1", field="vocab_size")
        high = int(tokens.max())
        if high >= vocab_size:
            flat = tokens.reshape(-1)
            where = int(np.argmax(flat >= vocab_size))
            raise TokenRangeError(
                f"token id {int(flat[where])} at flat position {where} >= vocab_size {vocab_size} (largest id {high})",
                field="build",
            )


def _cut(stream: np.ndarray, row_len: int, eos_id: int | None, drop_remainder: bool) -> tuple[np.ndarray, int]:
    full, remainder = divmod(stream.size, row_len)
    if remainder == 0 or drop_remainder:
        if remainder:
            log.warning(
                "drop_remainder=True: dropping the last %d tokens (less than one row of %d)", remainder, row_len
            )
        return np.ascontiguousarray(stream[: full * row_len]).reshape(full, row_len), 0
    rows = np.empty((full + 1, row_len), dtype=stream.dtype)
    rows.reshape(-1)[: stream.size] = stream
    rows[-1, remainder:] = eos_id if eos_id is not None else 0
    log.info("kept the last %d tokens as a last row padded with %d masked tokens", remainder, row_len - remainder)
    return rows, row_len - remainder
