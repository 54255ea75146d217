"""The bounded line reader every line input goes through: a block at a time, never a line over the cap whole.

    open_lines(path, kind, part)     the decompressed stream of a file (or of a line-aligned byte range)
    stream_lines(handle, raw, ...)   batches of (lines, raw byte counts, issue), up to an optional stop
    line_cuts / lines_before          line-aligned cut points of a plain file, and the lines before an offset

Problems found while reading (an over-long line, a truncated stream, an empty file) are :class:`Issue`
values, in input order, so that each user (tokenize's chunks, the record transform, hf-streaming's
blocks) decides whether a bad line is raised or counted.
"""

from __future__ import annotations

import contextlib
from bisect import bisect_left
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import accumulate
from pathlib import Path
from typing import Any

from tokenloom.tokenize.inputs._registry import InputReader
from tokenloom.tokenize.inputs.jsonl_zst import WindowError

__all__ = [
    "READ_BLOCK",
    "Batch",
    "Issue",
    "IssueKind",
    "invalid_utf8",
    "line_cuts",
    "line_start",
    "lines_before",
    "open_lines",
    "read_lines",
    "stream_lines",
]


class IssueKind(StrEnum):
    """Why a record could not be used; the keys of the skipped-records summary."""

    MALFORMED_JSON = "malformed_json"
    NOT_AN_OBJECT = "not_an_object"
    MISSING_FIELD = "missing_field"
    NON_STRING_FIELD = "non_string_field"
    INVALID_UTF8 = "invalid_utf8"
    LINE_TOO_LONG = "line_too_long"
    TRUNCATED_GZIP = "truncated_gzip"
    TRUNCATED_ZSTD = "truncated_zstd"
    TRUNCATED_STREAM = "truncated_stream"
    """A cut stream of another compression (a registered reader's)."""
    EMPTY_FILE = "empty_file"


@dataclass(frozen=True, slots=True)
class Issue:
    """One bad record: where (1-based line or row; 0 for a whole-file problem) and what."""

    line: int
    kind: IssueKind
    message: str
    offset: int | None = None
    """The byte offset in the file, where the line number alone does not say it (a cut compressed stream)."""
    cause: BaseException | None = field(default=None, compare=False, repr=False)
    """The decompressor's error, for a truncated stream."""


def invalid_utf8(line_number: int, exc: UnicodeDecodeError) -> Issue:
    """A line that is not UTF-8, named by the byte where it fails."""
    return Issue(line_number, IssueKind.INVALID_UTF8, f"the line is not valid UTF-8 (byte {exc.start}: {exc.reason})")


def _too_long(line_number: int, size: int, cap: int) -> Issue:
    return Issue(
        line_number,
        IssueKind.LINE_TOO_LONG,
        f"line has {size} bytes, over the cap of {cap} (raise it with --max-line-bytes if the record is genuine)",
    )


def _truncated(kind: InputReader, line: int, offset: int, exc: BaseException) -> Issue:
    name = kind.stream_name or "gzip"
    try:
        issue_kind = IssueKind(f"truncated_{name}")
    except ValueError:  # a registered reader's own compression
        issue_kind = IssueKind.TRUNCATED_STREAM
    detail = str(exc)
    if isinstance(exc, WindowError):  # the file is whole: it was compressed for a larger window than is decoded
        message = (
            f"the zstd stream cannot be read from line {line}, compressed byte {offset}: {detail}; recompress it "
            "with a window of 128 MiB or less (zstd -dc --long=31 FILE | zstd --long=27 -o NEW)"
        )
        return Issue(line, issue_kind, message, offset, exc)
    message = (
        f"the {name} stream is truncated or corrupt at line {line}, compressed byte {offset} ({detail}); "
        "the rest of the file cannot be read: copy or download it again"
    )
    return Issue(line, issue_kind, message, offset, exc)


#: Bytes read from a stream at a time: lines are cut out of each block by one ``bytes.split`` (a per-line
#: ``readline`` held the GIL for a fifth of a threaded run, docs/benchmarks.md #24).
READ_BLOCK = 1 << 20

#: What the line reader yields: (lines, raw byte counts, None) for a run of good lines, or
#: ([None], [raw byte count], issue) for one rejected line or a file-level issue.
Batch = tuple[list[bytes | None], list[int], "Issue | None"]


def _good_lines(lines: list[bytes], line_number: int, max_line_bytes: int, crlf: bool) -> Iterator[Batch]:
    """Complete lines (each still with a trailing \r, if any) -> batches; ``line_number`` is the first's."""
    sizes = list(map((1).__add__, map(len, lines)))  # in C: no Python frame per line
    if crlf:
        lines = [line[:-1] if line.endswith(b"\r") else line for line in lines]
    if max(sizes) - 1 <= max_line_bytes:
        yield lines, sizes, None  # type: ignore[misc]
        return
    start = 0  # a line over the cap: the good runs around it, and it as an issue, in order
    for i, size in enumerate(sizes):
        if size - 1 > max_line_bytes:
            if i > start:
                yield lines[start:i], sizes[start:i], None  # type: ignore[misc]
            yield [None], [size], _too_long(line_number + i, size, max_line_bytes)
            start = i + 1
    if start < len(lines):
        yield lines[start:], sizes[start:], None  # type: ignore[misc]


def open_lines(path: Path, kind: InputReader, part: tuple[int, int] | None = None) -> tuple[Any, Any]:
    """The decompressed stream of a line input and the raw file under it (whose position is progress).

    ``part``: bytes ``[start, stop)`` of an uncompressed file (line starts): the stream starts at ``start``.
    """
    raw = open(path, "rb")  # noqa: SIM115 (closed with the stream)
    try:
        if part is not None:
            raw.seek(part[0])
            return raw, raw
        return kind.open(raw), raw
    except BaseException:
        raw.close()
        raise


def read_lines(
    path: Path, kind: InputReader, max_line_bytes: int, opened: list[Any], part: tuple[int, int] | None = None
) -> Iterator[Batch]:
    """The lines of one file (or byte range) in batches; ``opened`` gets the raw file (its position is progress)."""
    handle, raw = open_lines(path, kind, part)
    opened.append(raw)
    return stream_lines(handle, raw, kind, max_line_bytes, stop=None if part is None else part[1] - part[0])


def stream_lines(
    handle: Any, raw: Any, kind: InputReader, max_line_bytes: int, *, stop: int | None = None
) -> Iterator[Batch]:
    """The lines of an open stream in batches (see :data:`Batch`), read a block at a time; closes both.

    A line is its bytes without the newline (and without the \r of a \r\n); its raw byte count includes
    them. A line over ``max_line_bytes`` is never held whole: it becomes a LINE_TOO_LONG issue. A last line
    without a newline is held back until the end of the stream is confirmed, so a truncated gzip or zstd
    file is reported as such, not as a broken record. ``stop``: only the lines that start before this many
    bytes of the stream (a line that starts before it is read to its end).
    """
    batches = _batches(handle, raw, kind, max_line_bytes)
    if stop is None:
        return batches
    return _until(batches, stop)


def _until(batches: Generator[Batch], stop: int) -> Iterator[Batch]:
    position = 0
    with contextlib.closing(batches):
        for lines, sizes, issue in batches:
            if position >= stop:
                return
            if issue is not None and issue.line == 0:
                yield lines, sizes, issue
                continue
            ends = list(accumulate(sizes, initial=position))
            keep = bisect_left(ends, stop, hi=len(sizes))  # lines [0, keep) start before stop
            if keep < len(sizes):
                if keep:
                    yield lines[:keep], sizes[:keep], issue
                return
            position = ends[-1]
            yield lines, sizes, issue


def _batches(handle: Any, raw: Any, kind: InputReader, max_line_bytes: int) -> Generator[Batch]:
    line_number = 0  # lines yielded so far
    broken: Issue | None = None
    tail: list[bytes] = []  # the start of a line whose newline is not read yet
    tail_bytes = 0
    skipping = -1  # >= 0: the bytes so far of a line over the cap, being skipped to its newline
    with handle, raw:
        try:
            while True:
                block = handle.read1(READ_BLOCK)  # one read of the stream: the lines before a fault are kept
                if not block:
                    break
                if skipping >= 0:
                    newline = block.find(b"\n")
                    if newline < 0:
                        skipping += len(block)
                        continue
                    line_number += 1
                    size = skipping + newline + 1
                    yield [None], [size], _too_long(line_number, size, max_line_bytes)
                    skipping = -1
                    block = block[newline + 1 :]
                lines = block.split(b"\n")
                rest = lines.pop()  # after the last newline: the start of the next line
                if lines:
                    if tail:
                        tail.append(lines[0])
                        lines[0] = b"".join(tail)
                        tail, tail_bytes = [], 0
                    crlf = b"\r" in block or lines[0].endswith(b"\r")  # (the \r of a \r\n may end the last block)
                    yield from _good_lines(lines, line_number + 1, max_line_bytes, crlf)
                    line_number += len(lines)
                if rest:
                    tail.append(rest)
                    tail_bytes += len(rest)
                    if tail_bytes > max_line_bytes:
                        skipping, tail, tail_bytes = tail_bytes, [], 0
        except (EOFError, *kind.stream_errors) as exc:
            broken = _truncated(kind, line_number + 1, raw.tell(), exc)
    if broken is not None:
        yield [None], [0], broken
        return
    if skipping >= 0:  # a last line over the cap, without a newline
        line_number += 1
        yield [None], [skipping], _too_long(line_number, skipping, max_line_bytes)
    elif tail:  # a last line without a newline, kept as it is (a trailing \r included)
        line_number += 1
        yield [b"".join(tail)], [tail_bytes], None
    if line_number == 0:
        yield [None], [0], Issue(0, IssueKind.EMPTY_FILE, "the file holds no lines (an empty input file)")


def line_start(handle: Any, target: int) -> int:
    """The first line start at or after byte ``target`` of a seekable stream, which is left there.

    Read a MiB at a time from the byte before: a target that is already a line start stays one, and a line
    of gigabytes is never held whole.
    """
    if target <= 0:
        handle.seek(0)
        return 0
    handle.seek(target - 1)
    while (piece := handle.readline(1 << 20)) and not piece.endswith(b"\n"):
        pass
    return handle.tell()


def line_cuts(path: Path, size: int, unit_bytes: int) -> list[int]:
    """Line starts at or after each multiple of ``unit_bytes`` (deduplicated), plus 0 and ``size``."""
    cuts = [0]
    reached = 0  # the end of the last line scanned
    with open(path, "rb") as handle:
        for target in range(unit_bytes, size, unit_bytes):
            if target <= reached:
                continue  # a line longer than unit_bytes already covers this target
            cut = reached = line_start(handle, target)
            if cut < size and cut > cuts[-1]:
                cuts.append(cut)
    cuts.append(size)
    return cuts


def lines_before(path: Path, offset: int) -> int:
    """How many lines of ``path`` end before byte ``offset`` (a unit's line numbers are counted from there)."""
    count = 0
    with open(path, "rb") as handle:
        left = offset
        while left > 0 and (block := handle.read(min(left, 8 << 20))):
            count += block.count(b"\n")
            left -= len(block)
    return count
