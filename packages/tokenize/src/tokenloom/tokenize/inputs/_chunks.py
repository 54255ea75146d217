"""Inputs read as deterministic chunks: tokenize's text runs.

A line input's chunk is at most ``chunk_lines`` lines or ``chunk_bytes`` bytes of one file; a row
input's chunk is a row group or record batch, cut into ranges of at most ``chunk_lines`` rows
(``_rows``). So the same files always give the same
chunks, whatever the worker count. Problems found while reading (an over-long
line, a truncated stream, an empty file, a row without the text field) travel
with the chunk as :class:`Issue` values, so they are reported in input order
together with the problems the workers find while parsing.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Protocol

from tokenloom.tokenize.inputs._files import InputFile, named_by_url, reader_of
from tokenloom.tokenize.inputs._lines import Issue, IssueKind, read_lines
from tokenloom.tokenize.inputs._rows import ColumnarFile, ColumnarPiece
from tokenloom.tokenize.inputs._units import ByteRange, Part, RowGroups

__all__ = ["Chunk", "read_chunks"]


class _Tell(Protocol):
    def tell(self) -> int: ...


@dataclass(slots=True)
class Chunk:
    """Consecutive lines of one input file, numbered from ``first_line`` (1-based).

    ``lines[i]`` is line ``first_line + i`` without its newline, or None when the
    reader already rejected it (its Issue is in ``issues``). A parquet or Arrow
    chunk has no lines: ``texts[i]`` is the text of row ``first_line + i``, or None
    when the row has none (its Issue is in ``issues``).
    """

    index: int
    file_index: int
    path: str
    first_line: int
    lines: list[bytes | None] = field(default_factory=list)
    issues: list[Issue] = field(default_factory=list)
    num_bytes: int = 0
    source_bytes: int = 0
    """Bytes of the file on disk (compressed, for gzip) consumed by this chunk, for progress."""
    texts: list[str | None] | None = None

    @property
    def num_records(self) -> int:
        return len(self.lines) if self.texts is None else len(self.texts)


def _position(opened: list[_Tell], size: int) -> int:
    try:
        return min(opened[0].tell(), size) if opened else 0
    except (ValueError, OSError):  # closed at the end of the file
        return size


def _columnar_chunk(piece: ColumnarPiece, index: int, file_index: int, path: str, dotted: str) -> Chunk:
    chunk = Chunk(index, file_index, path, piece.first_row, num_bytes=piece.text_bytes, texts=piece.texts)
    chunk.source_bytes = piece.source_bytes
    missing = set(piece.missing)
    for offset, text in enumerate(piece.texts):
        if text is None:
            row = piece.first_row + offset
            if offset in missing:
                problem = f"the row has no field {dotted!r} (a struct on the path is null)"
                chunk.issues.append(Issue(row, IssueKind.MISSING_FIELD, problem))
            else:
                problem = f"field {dotted!r} is null, expected a string"
                chunk.issues.append(Issue(row, IssueKind.NON_STRING_FIELD, problem))
    return chunk


def read_chunks(
    files: list[InputFile],
    *,
    chunk_lines: int,
    chunk_bytes: int,
    max_line_bytes: int,
    text_field: tuple[str, ...] | str = "text",
    start_chunk: int = 0,
    first_file: int = 0,
    first_file_chunk: int = 0,
    parts: Sequence[Part | None] | None = None,
) -> Iterator[Chunk]:
    """Chunks of every file in order, numbered from 0; those before ``start_chunk`` are not yielded.

    Chunk boundaries depend only on the file contents and the three limits. To
    resume, files before ``first_file`` are skipped unread, and that file's first
    chunk is numbered ``first_file_chunk``. ``text_field`` (a dotted path) picks
    the column of parquet and Arrow inputs; jsonl lines are parsed by the workers.
    ``parts[i]`` (sub-file units) limits file i to a byte range or to some row groups;
    a byte range's lines are numbered from 1 at its start.
    """
    field_path = tuple(text_field.split(".")) if isinstance(text_field, str) else text_field
    dotted = ".".join(field_path)
    index = first_file_chunk
    for file_index, info in enumerate(files):
        if file_index < first_file:
            continue
        path, kind = reader_of(info)
        part = parts[file_index] if parts is not None else None
        if kind.rows:
            source: ColumnarFile | None = None
            if info.size > 0:  # a 0-byte row file has no footer to read: an empty file, as a 0-byte jsonl
                groups = (part.start, part.stop) if isinstance(part, RowGroups) else None
                with named_by_url(info):
                    source = ColumnarFile(path, kind, field_path, chunk_rows=chunk_lines, row_groups=groups)
            cuts = len(source.cuts) if source is not None else 0
            for number in range(cuts):
                if index + number >= start_chunk:
                    with named_by_url(info):
                        piece = source.read(number)  # pyright: ignore[reportOptionalMemberAccess] (cuts > 0)
                    yield _columnar_chunk(piece, index + number, file_index, info.shown, dotted)
            if not cuts:
                if index >= start_chunk:
                    empty = Issue(0, IssueKind.EMPTY_FILE, f"the {kind.name} file holds no rows")
                    yield Chunk(index, file_index, info.shown, 1, [], [empty], 0, info.size, [])
                index += 1
            index += cuts
            continue
        opened: list[_Tell] = []
        consumed = 0
        chunk = Chunk(index=index, file_index=file_index, path=info.shown, first_line=1)
        byte_range = part if isinstance(part, ByteRange) else None
        size_here = info.size if byte_range is None else byte_range.stop - byte_range.start
        span = None if byte_range is None else (byte_range.start, byte_range.stop)
        for lines, sizes, issue in read_lines(path, kind, max_line_bytes, opened, span):
            if issue is not None:
                chunk.issues.append(issue)
                if issue.line == 0:  # a file-level issue holds no line
                    lines = []
            # A chunk ends after the line that brings it to chunk_lines lines or chunk_bytes bytes: cut the
            # batch where that happens (the cumulative byte counts, searched), as a line-by-line loop would.
            ends = list(accumulate(sizes))
            taken, before, count = 0, 0, len(lines)
            while taken < count:
                byte_end = bisect_left(ends, before + chunk_bytes - chunk.num_bytes, taken)
                take = min(byte_end + 1 - taken, chunk_lines - len(chunk.lines), count - taken)
                chunk.lines.extend(lines[taken : taken + take])
                taken += take
                chunk.num_bytes += ends[taken - 1] - before
                before = ends[taken - 1]
                if len(chunk.lines) >= chunk_lines or chunk.num_bytes >= chunk_bytes:
                    # a plain file's bytes are its lines' (exact); a compressed one's, where its reader is
                    now = (
                        min(consumed + chunk.num_bytes, size_here)
                        if not kind.stream_name
                        else _position(opened, size_here)
                    )
                    chunk.source_bytes, consumed = now - consumed, now
                    if index >= start_chunk:
                        yield chunk
                    index += 1
                    next_line = chunk.first_line + len(chunk.lines)
                    chunk = Chunk(index=index, file_index=file_index, path=info.shown, first_line=next_line)
        if chunk.lines or chunk.issues:
            chunk.source_bytes = max(size_here - consumed, 0)
            if index >= start_chunk:
                yield chunk
            index += 1
