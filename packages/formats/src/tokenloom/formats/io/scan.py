"""Chunked whole-shard scans for formats whose boundaries or id ranges live in the tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tokenloom.formats.errors import DataError, IndexCorruptError, TruncatedError
from tokenloom.formats.io.index_map import iter_chunks

__all__ = [
    "SCAN_CHUNK_TOKENS",
    "RisingFromZero",
    "check_exact_size",
    "check_rising_from_zero",
    "eos_offsets",
    "iter_eos_offsets",
    "first_negative",
]

SCAN_CHUNK_TOKENS = 1 << 20


def eos_offsets(tokens: np.ndarray, eos_id: int, *, chunk_tokens: int = SCAN_CHUNK_TOKENS) -> np.ndarray:
    """Entry offsets (int64, from 0 to ``len(tokens)``) that end each entry just after an ``eos_id``.

    Tokens after the last EOS form a final entry of their own.
    """
    return np.concatenate(list(iter_eos_offsets(tokens, eos_id, chunk_tokens=chunk_tokens)))


def iter_eos_offsets(tokens: np.ndarray, eos_id: int, *, chunk_tokens: int = SCAN_CHUNK_TOKENS) -> Iterator[np.ndarray]:
    """:func:`eos_offsets` in chunks, streaming over the tokens (mapped pages are released as it goes)."""
    yield np.zeros(1, dtype=np.int64)
    last = 0
    for start, chunk in iter_chunks(tokens, chunk_tokens):
        ends = np.flatnonzero(chunk == eos_id).astype(np.int64) + (start + 1)
        if len(ends):
            last = int(ends[-1])
            yield ends
    if last != len(tokens):
        yield np.array([len(tokens)], dtype=np.int64)


def first_negative(tokens: np.ndarray, *, chunk_tokens: int = SCAN_CHUNK_TOKENS) -> int | None:
    """Position of the first negative id (only signed dtypes can hold one), or None."""
    if tokens.dtype.kind != "i":
        return None
    for start, chunk in iter_chunks(tokens, chunk_tokens):
        if len(chunk) and chunk.min() < 0:
            return start + int(np.argmax(chunk < 0))
    return None


def check_rising_from_zero(
    values: np.ndarray, *, what: str, one: str, path: Path | str, at: int, field: str, record_shift: int = 0
) -> None:
    """IndexCorruptError unless the int64 ``values`` (stored from byte ``at``) start at 0 and never decrease.

    ``what`` names the values in the plural ("offsets"), ``one`` in the singular; ``record_shift``
    is added to the index of the step that decreases to give the record a message names.
    Streams in bounded chunks (``values`` may be a memory map of 10^9 entries).
    """
    rising = RisingFromZero(what=what, one=one, path=path, at=at, field=field, record_shift=record_shift)
    for start, part in iter_chunks(values):
        rising.check(part, start)


class RisingFromZero:
    """:func:`check_rising_from_zero` fed chunk by chunk: ``check(part, start)`` for consecutive parts."""

    def __init__(self, *, what: str, one: str, path: Path | str, at: int, field: str, record_shift: int = 0) -> None:
        self.what, self.one, self.path, self.at, self.field = what, one, path, at, field
        self.record_shift = record_shift
        self._last: int | None = None

    def check(self, part: np.ndarray, start: int) -> np.ndarray:
        """Raise at a decrease; returns the steps from the previous part's last value through ``part``."""
        if not len(part):
            return np.empty(0, dtype=np.int64)
        if self._last is None:
            if part[0] != 0:
                raise IndexCorruptError(
                    f"first {self.one} is {int(part[0])}, expected 0", path=self.path, offset=self.at, field=self.field
                )
            values, first = part, start
        else:
            values, first = np.concatenate([np.array([self._last], dtype=part.dtype), part]), start - 1
        steps = np.diff(values)
        if len(steps) and steps.min() < 0:
            i = int(np.argmax(steps < 0))
            raise IndexCorruptError(
                f"{self.what} decrease ({int(values[i])} then {int(values[i + 1])}), expected non-decreasing",
                path=self.path,
                offset=self.at + 8 * (first + i + 1),
                record=first + i + self.record_shift,
                field=self.field,
            )
        self._last = int(part[-1])
        return steps


def check_exact_size(
    actual: int, expected: int, problem: str, *, larger: type[DataError] = IndexCorruptError, **where: Any
) -> None:
    """TruncatedError if ``actual`` bytes fall short of ``expected``, ``larger`` if they exceed it.

    ``problem`` says what was found; ``where`` (path, offset, field) goes to the error.
    """
    if actual != expected:
        raise (TruncatedError if actual < expected else larger)(problem, **where)
