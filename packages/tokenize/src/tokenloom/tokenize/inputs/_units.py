"""Sub-file units: a large input cut into pieces that nodes encode independently.

    a reader cut by BYTES (plain .jsonl) larger than unit_bytes -> line-aligned byte ranges: the cut k
        sits at the first line start at or after k * unit_bytes (seek there, read to the next newline)
    a reader cut by ROW_GROUPS (parquet) larger than unit_bytes -> runs of whole row groups of about
        unit_bytes (compressed sizes from the footer)
    anything else (.gz, .zst, .json.gz, Arrow) -> the whole file (a compressed stream cannot be
        entered in the middle)

The cuts depend only on the file's bytes and ``unit_bytes``, so every node computes the same
plan from the same inputs; a file changed since the plan changes its size or mtime (or hash),
which the run key already holds, so it is a ResumeMismatchError naming the file.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from tokenloom.formats import DataError
from tokenloom.tokenize.inputs._files import InputFile, named_by_url, reader_of
from tokenloom.tokenize.inputs._lines import line_cuts
from tokenloom.tokenize.inputs._registry import Cut, InputReader

__all__ = ["ByteRange", "Part", "RowGroups", "UnitSource", "cut_units"]


@dataclass(frozen=True, slots=True)
class _Span:
    """``[start, stop)`` of one kind of piece of a file: its JSON key and its label name the kind."""

    start: int
    stop: int
    KEY: ClassVar[str] = ""
    LAST: ClassVar[int] = 0  # 1: the label names the last piece, not the stop

    def to_json(self) -> dict[str, object]:
        return {self.KEY: [self.start, self.stop]}

    def label(self) -> str:
        return f"{self.KEY.replace('_', ' ')} {self.start}-{self.stop - self.LAST}"


class ByteRange(_Span):
    """Bytes ``[start, stop)`` of an uncompressed jsonl file; both ends are line starts (or the end of the file)."""

    __slots__ = ()
    KEY = "bytes"


class RowGroups(_Span):
    """Row groups ``[start, stop)`` of a parquet file."""

    __slots__ = ()
    KEY, LAST = "row_groups", 1


Part = ByteRange | RowGroups


@dataclass(frozen=True, slots=True)
class UnitSource:
    """What one unit reads: input file ``file_index`` of the run, whole (``part`` None) or a part of it."""

    file_index: int
    file: InputFile
    part: Part | None = None

    @property
    def label(self) -> str:
        return self.file.relative if self.part is None else f"{self.file.relative} [{self.part.label()}]"

    def to_json(self) -> dict[str, object]:
        return {"input": self.file.relative, **(self.part.to_json() if self.part is not None else {})}


def _row_group_runs(path: Path, kind: InputReader, unit_bytes: int) -> list[tuple[int, int]]:
    try:
        rows = kind.open(path, page_checksum_verification=False)
    except DataError:
        return []  # unreadable footer: one whole-file unit, whose reading names the error
    runs: list[tuple[int, int]] = []
    first, size = 0, 0
    for group in range(len(rows.units)):
        size += rows.unit_bytes(group)
        if size >= unit_bytes:
            runs.append((first, group + 1))
            first, size = group + 1, 0
    if first < len(rows.units):
        runs.append((first, len(rows.units)))
    return runs


def cut_units(files: list[InputFile], unit_bytes: int | None) -> list[UnitSource]:
    """The units of ``files`` in order: whole files, or parts of files larger than ``unit_bytes`` (None: never cut)."""
    units: list[UnitSource] = []
    for index, info in enumerate(files):
        if unit_bytes is None or info.size <= unit_bytes:
            units.append(UnitSource(index, info))
            continue
        path, kind = reader_of(info)
        if kind.cut is Cut.BYTES:
            cuts = line_cuts(path, info.size, unit_bytes)
            units.extend(UnitSource(index, info, ByteRange(a, b)) for a, b in itertools.pairwise(cuts))
            continue
        with named_by_url(info):
            runs = _row_group_runs(path, kind, unit_bytes) if kind.cut is Cut.ROW_GROUPS else []
        if len(runs) > 1:
            units.extend(UnitSource(index, info, RowGroups(a, b)) for a, b in runs)
        else:
            units.append(UnitSource(index, info))
    return units
