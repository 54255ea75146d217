"""Records with their identity: what a record transform (and hf-streaming) takes from an input.

    line inputs: Record(path, line, the line's bytes, byte offset, size)  1-based lines, offsets in the stream
    row inputs:  Record(path, row, the row as a dict)                     1-based rows of the file

A line over the cap is a Record with no value and its :class:`Issue`; a problem of the stream (a cut
stream, an empty file) is an Issue in its place. The user decides whether it is raised or counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from tokenloom.tokenize.inputs._files import reader_of
from tokenloom.tokenize.inputs._lines import Batch, Issue, IssueKind, read_lines
from tokenloom.tokenize.inputs._rows import RowFile
from tokenloom.tokenize.inputs._units import ByteRange, RowGroups, UnitSource

__all__ = ["Record", "line_records", "read_records", "row_records"]


@dataclass(frozen=True, slots=True)
class Record:
    """One input record and where it is: the file as messages name it, its 1-based line (or row) and, for a
    line, its byte offset in the decompressed stream."""

    path: str
    line: int
    value: Any
    """A line's bytes without its newline (JSON text, for every jsonl kind), or a row as a dict; None for a
    line the reader rejected (``issue`` says why)."""
    offset: int | None = None
    size: int = 0
    """A line's raw bytes, its newline included."""
    issue: Issue | None = None


def line_records(batches: Iterable[Batch], path: str, *, offset: int = 0) -> Iterator[Record | Issue]:
    """Batches of the line reader as records (lines numbered from 1, offsets from ``offset``) and issues."""
    line = 0
    for lines, sizes, issue in batches:
        if issue is not None:
            if issue.kind is IssueKind.LINE_TOO_LONG:
                line = issue.line
                yield Record(path, line, None, offset, sizes[0], issue)
                offset += sizes[0]
            else:
                yield issue
            continue
        for value, size in zip(lines, sizes, strict=True):
            line += 1
            yield Record(path, line, value, offset, size)
            offset += size


def row_records(rows: RowFile, units: range, path: str, columns: list[str] | None = None) -> Iterator[Record]:
    """The rows of some units of a row file as dicts (only ``columns``, if given), numbered in the file."""
    row = sum(rows.units[: units.start])
    for unit in units:
        for value in rows.read(unit, columns).to_pylist():
            row += 1
            yield Record(path, row, value)


def read_records(source: UnitSource, max_line_bytes: int) -> Iterator[Record | Issue]:
    """The records of one unit in input order. A byte-range unit numbers its lines from 1 at its start.

    An unreadable row file (a damaged footer, page or batch) is a FormatError naming it and the rows.
    """
    info = source.file
    path, kind = reader_of(info)
    if not kind.rows:
        part = source.part if isinstance(source.part, ByteRange) else None
        span = None if part is None else (part.start, part.stop)
        yield from line_records(read_lines(path, kind, max_line_bytes, [], span), info.shown)
        return
    rows: RowFile = kind.open(path, shown=info.shown)
    part = source.part
    units = range(part.start, part.stop) if isinstance(part, RowGroups) else range(len(rows.units))
    yield from row_records(rows, units, info.shown)
