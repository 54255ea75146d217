"""Input discovery and robust reading, cut into deterministic chunks.

Inputs are jsonl (plain, gzip or zstd; one JSON object per line), parquet and
Arrow IPC files, told apart by their magic bytes (``_sniff``). A jsonl chunk is
at most ``chunk_lines`` lines or ``chunk_bytes`` bytes of one file; a parquet
or Arrow chunk is a row group or record batch, cut into ranges of at most
``chunk_lines`` rows (``_columnar``). So the same files always give the same
chunks, whatever the worker count. Problems found while reading (an over-long
line, a truncated stream, an empty file, a row without the text field) travel
with the chunk as :class:`Issue` values, so they are reported in input order
together with the problems the workers find while parsing.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import zlib
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import accumulate
from pathlib import Path
from typing import Any, Protocol

import xxhash

from tokenloom.formats import ConfigError, MissingFileError, UnsafePathError
from tokenloom.formats.io import storage_error
from tokenloom.tokenize._columnar import ColumnarFile, ColumnarPiece
from tokenloom.tokenize._fetch import local_path, named_by_url
from tokenloom.tokenize._sniff import INPUT_SUFFIXES, InputKind, sniff
from tokenloom.tokenize._streams import StreamError, WindowError, open_stream
from tokenloom.tokenize._unit_parts import ByteRange, Part, RangeReader, RowGroups

__all__ = [
    "INPUT_SUFFIXES",
    "Chunk",
    "InputFile",
    "Issue",
    "IssueKind",
    "InputKind",
    "discover_inputs",
    "read_chunks",
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
    EMPTY_FILE = "empty_file"


@dataclass(frozen=True, slots=True)
class Issue:
    """One bad record: where (1-based line or row; 0 for a whole-file problem) and what."""

    line: int
    kind: IssueKind
    message: str
    offset: int | None = None
    """The byte offset in the file, where the line number alone does not say it (a cut compressed stream)."""


@dataclass(frozen=True, slots=True)
class InputFile:
    """An input file and what identifies its content for resume checks."""

    path: Path
    relative: str
    size: int
    mtime_ns: int
    content_hash: str | None = None
    kind: InputKind | None = None
    """What the file holds by its magic bytes (None: look when it is read); not part of the run key."""
    url: str | None = None
    """An input in object storage: its URL; ``path`` is then where it is staged when first read."""
    etag: str | None = None
    """An input in object storage: its ETag (or version) when listed; part of the run key instead of the mtime."""
    remote: Any = field(default=None, repr=False, compare=False)
    """An input in object storage: ``(StoreConfig, ObjectInfo)`` to fetch it (never in the run key or a message)."""

    def to_json(self) -> dict[str, object]:
        if self.etag is not None:
            return {"path": self.relative, "size": self.size, "etag": self.etag}
        data: dict[str, object] = {"path": self.relative, "size": self.size, "mtime_ns": self.mtime_ns}
        if self.content_hash is not None:
            data["xxh3_128"] = self.content_hash
        return data

    @property
    def shown(self) -> str:
        """How messages name the input: its URL, or its path."""
        return self.url or str(self.path)


def _hash_file(path: Path) -> str:
    digest = xxhash.xxh3_128()
    with open(path, "rb") as handle:
        while block := handle.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()


def _regular_input(path: Path) -> Path:
    """``path`` if it is a readable regular file; otherwise a named error (never a silent skip)."""
    try:
        info = path.stat()
    except OSError as exc:
        raise storage_error(exc, path, "looking at an input file") from exc
    if not stat.S_ISREG(info.st_mode):
        kind = "FIFO" if stat.S_ISFIFO(info.st_mode) else "socket or device"
        if stat.S_ISDIR(info.st_mode):
            kind = "directory"
        raise UnsafePathError(
            f"input {path.name} is a {kind}, not a regular file",
            path=path,
            hint="Inputs are found by their suffix (.jsonl, .jsonl.gz, .parquet, ...); rename or move this entry "
            "out of --input-dir",
        )
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise storage_error(exc, path, "opening an input file") from exc
    return path


def _check_utf8_name(path: Path, root: Path) -> None:
    """Refuse an input whose name is not valid UTF-8, before anything is written.

    Why refuse rather than escape: every input's name goes into the run key, the resume
    journal and the manifest (JSON text) and into messages; an escaped spelling could
    collide with a real name in the identity that resume relies on, and a rename is a
    one-line fix.
    """
    relative = str(path.relative_to(root))
    try:
        relative.encode("utf-8")
    except UnicodeEncodeError:
        shown = relative.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        where = str(root).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise UnsafePathError(
            f"input file name '{shown}' is not valid UTF-8 (bytes shown as \\xNN)",
            path=where,
            field="input_dir",
            hint="Rename the file to a UTF-8 name (e.g. with `convmv -f latin1 -t utf8` or mv): input names are "
            "recorded in the run's journal and manifest, which are JSON text",
        ) from None


def discover_inputs(input_dir: str | os.PathLike[str], *, hash_contents: bool = False) -> list[InputFile]:
    """Every input file (by :data:`INPUT_SUFFIXES`) under ``input_dir``, recursively, sorted by path.

    Each file's magic bytes must agree with its suffix (a FormatError otherwise), checked here so that
    a mislabelled file stops the run before anything is written.
    """
    root = Path(input_dir)
    if not root.is_dir():
        raise MissingFileError(
            "input directory does not exist or is not a directory",
            path=root,
            hint="Pass --input-dir DIR holding .jsonl(.gz/.zst), .json.gz, .parquet or .arrow files",
        )
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames:
            if name.endswith(INPUT_SUFFIXES):
                found.append(_regular_input(Path(dirpath) / name))
    found.sort(key=lambda p: p.relative_to(root).as_posix())
    if not found:
        raise ConfigError(
            "no input files (.jsonl, .jsonl.gz, .jsonl.zst, .json.gz, .parquet, .arrow) under the input directory",
            path=root,
            field="input_dir",
            hint="Check --input-dir; inputs are found recursively by their suffix",
        )
    files = []
    for path in found:
        _check_utf8_name(path, root)
        info = path.stat()
        files.append(
            InputFile(
                path=path,
                relative=path.relative_to(root).as_posix(),
                size=info.st_size,
                mtime_ns=info.st_mtime_ns,
                content_hash=_hash_file(path) if hash_contents else None,
                kind=sniff(path),
            )
        )
    return files


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


def _too_long(line_number: int, size: int, cap: int) -> Issue:
    return Issue(
        line_number,
        IssueKind.LINE_TOO_LONG,
        f"line has {size} bytes, over the cap of {cap} (raise it with --max-line-bytes if the record is genuine)",
    )


def _truncated(kind: InputKind, line: int, offset: int, detail: str, window: bool = False) -> Issue:
    issue_kind, name = (
        (IssueKind.TRUNCATED_ZSTD, "zstd") if kind is InputKind.JSONL_ZSTD else (IssueKind.TRUNCATED_GZIP, "gzip")
    )
    if window:  # the file is whole: it was compressed for a larger window than is decoded
        message = (
            f"the zstd stream cannot be read from line {line}, compressed byte {offset}: {detail}; recompress it "
            "with a window of 128 MiB or less (zstd -dc --long=31 FILE | zstd --long=27 -o NEW)"
        )
        return Issue(line, issue_kind, message, offset)
    message = (
        f"the {name} stream is truncated or corrupt at line {line}, compressed byte {offset} ({detail}); "
        "the rest of the file cannot be read: copy or download it again"
    )
    return Issue(line, issue_kind, message, offset)


#: Bytes read from a stream at a time: lines are cut out of each block by one ``bytes.split`` (a per-line
#: ``readline`` held the GIL for a fifth of a threaded run, docs/benchmarks.md #24).
READ_BLOCK = 1 << 20

#: What the line reader yields: (lines, raw byte counts, None) for a run of good lines, or
#: ([None], [raw byte count], issue) for one rejected line or a file-level issue.
Batch = tuple[list[bytes | None], list[int], "Issue | None"]


def _good_lines(lines: list[bytes], line_number: int, max_line_bytes: int, crlf: bool) -> Iterator[Batch]:
    """Complete lines (each still with a trailing \r, if any) -> batches; ``line_number`` is the first's."""
    sizes = [len(line) + 1 for line in lines]
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


def _read_lines(
    path: Path, kind: InputKind, max_line_bytes: int, opened: list[_Tell], part: ByteRange | None = None
) -> Iterator[Batch]:
    """The lines of one file in batches (see :data:`Batch`), read a block at a time.

    A line is its bytes without the newline (and without the \r of a \r\n); its raw byte count includes
    them. A line over ``max_line_bytes`` is never held whole: it becomes a LINE_TOO_LONG issue. A last line
    without a newline is held back until the end of the stream is confirmed, so a truncated gzip or zstd
    file is reported as such, not as a broken record.
    """
    line_number = 0  # lines yielded so far
    if part is None:
        handle, raw = open_stream(path, kind)
    else:  # a sub-file unit of a plain jsonl file (line-aligned ends: no line crosses them)
        raw = RangeReader(path, part.start, part.stop)
        handle = io.BufferedReader(raw, READ_BLOCK)
    opened.append(raw)
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
        except (EOFError, gzip.BadGzipFile, zlib.error, StreamError) as exc:
            broken = _truncated(kind, line_number + 1, raw.tell(), str(exc), window=isinstance(exc, WindowError))
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


def _position(opened: list[_Tell], size: int) -> int:
    try:
        return min(opened[0].tell(), size) if opened else 0
    except (ValueError, OSError):  # closed at the end of the file
        return size


def _columnar_chunk(piece: ColumnarPiece, index: int, file_index: int, path: str, dotted: str) -> Chunk:
    chunk = Chunk(
        index=index,
        file_index=file_index,
        path=path,
        first_line=piece.first_row,
        num_bytes=piece.text_bytes,
        source_bytes=piece.source_bytes,
        texts=piece.texts,
    )
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
        path = local_path(info)
        with named_by_url(info):
            kind = info.kind or sniff(path)
        part = parts[file_index] if parts is not None else None
        if kind.columnar and info.size > 0:
            groups = (part.first, part.stop) if isinstance(part, RowGroups) else None
            with named_by_url(info):
                source = ColumnarFile(path, kind, field_path, chunk_rows=chunk_lines, row_groups=groups)
            for number in range(len(source.cuts)):
                if index + number >= start_chunk:
                    with named_by_url(info):
                        piece = source.read(number)
                    yield _columnar_chunk(piece, index + number, file_index, info.shown, dotted)
            if not source.cuts:
                if index >= start_chunk:
                    empty = Issue(0, IssueKind.EMPTY_FILE, f"the {kind} file holds no rows")
                    yield Chunk(index, file_index, info.shown, 1, [], [empty], 0, info.size, [])
                index += 1
            index += len(source.cuts)
            continue
        opened: list[_Tell] = []
        consumed = 0
        chunk = Chunk(index=index, file_index=file_index, path=info.shown, first_line=1)
        byte_range = part if isinstance(part, ByteRange) else None
        size_here = info.size if byte_range is None else byte_range.stop - byte_range.start
        for lines, sizes, issue in _read_lines(path, kind, max_line_bytes, opened, byte_range):
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
                        if kind is InputKind.JSONL
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
