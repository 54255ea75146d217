"""Read a unit as blocks of records, seeking where the source allows.

The bytes, lines and rows come from the input room tokenize reads with (``tokenloom.tokenize.inputs``:
decompression with bounded output, 1 MiB line reads, a line over the cap never held whole); this adds
hf-streaming's positions and its error policy. Every reader yields :class:`Block` s of ``block_size``
kept records in source order, starting at block ``start_block``. ``hint`` is where that block starts
(a byte offset for line sources, ignored elsewhere): with it a seekable stream is entered straight
there, so resuming costs one block, not the position. A record's ``doc_id`` is a stable global id:
``source << 40 | byte offset`` (lines), ``source << 40 | row`` (rows, HF shards).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from tokenloom.formats import DataError, FormatError, MissingKeyError, RecordError, RemoteOptions, TruncatedError
from tokenloom.hf_streaming._remote import RangeReader
from tokenloom.hf_streaming._units import Source, SourceKind, Unit, open_rows
from tokenloom.tokenize.inputs import (
    Cut,
    CutStreamError,
    Issue,
    IssueKind,
    WindowError,
    line_records,
    line_start,
    row_records,
    stream_lines,
)

__all__ = ["DEFAULT_MAX_LINE_BYTES", "READ_BYTES", "SOURCE_SHIFT", "Block", "read_blocks", "text_of"]

SOURCE_SHIFT = 40
DEFAULT_MAX_LINE_BYTES = 64 << 20
"""A jsonl line longer than this is a bad record, never read whole (tokenize and pack use the same cap)."""
READ_BYTES = 4 << 20
"""Bytes per ranged GET of a remote line stream."""


@dataclass(slots=True)
class Block:
    index: int
    hint: int
    doc_ids: list[int] = field(default_factory=list)
    texts: list[str | None] = field(default_factory=list)
    """None where a bad record was skipped (``on_error="skip"``)."""


def text_of(
    record: Any, text_field: str, on_error: str, *, path: str, offset: int | None, row: int | None
) -> str | None:
    """The text of one record, or a named error (None when skipping)."""
    if not isinstance(record, dict):
        problem = f"record is a JSON {type(record).__name__}, expected an object with a {text_field!r} field"
    elif text_field not in record:
        problem = f"record has no {text_field!r} field (it has {sorted(record)[:8]})"
    elif not isinstance(record[text_field], str):
        problem = f"field {text_field!r} is {type(record[text_field]).__name__}, expected a string"
    else:
        return record[text_field]
    if on_error == "skip":
        return None
    raise RecordError(
        problem,
        path=path,
        offset=offset,
        record=row,
        field=text_field,
        hint="Fix the record, or pass on_error='skip' to count and skip such records",
    )


def _open(source: Source) -> tuple[Any, Any]:
    """The decompressed stream of a line source and the raw bytes under it (local, or by ranged reads)."""
    try:
        if source.remote is None:
            raw: Any = open(source.path, "rb")  # noqa: SIM115 (closed with the stream)
        else:
            raw = io.BufferedReader(RangeReader(source.remote, source.access or RemoteOptions()), READ_BYTES)
    except OSError as exc:
        raise FormatError(f"cannot open: {exc.strerror}", path=source.path) from None
    try:
        return source.reader.open(raw), raw
    except BaseException:
        raw.close()
        raise


_CUT = (IssueKind.TRUNCATED_GZIP, IssueKind.TRUNCATED_ZSTD, IssueKind.TRUNCATED_STREAM)


def _stream_error(issue: Issue, path: str) -> DataError:
    """A cut, corrupt or too-wide compressed stream, named as such."""
    if isinstance(issue.cause, WindowError):
        return FormatError(
            str(issue.cause),
            path=path,
            hint="Recompress it with a window of 128 MiB or less: zstd -dc --long=31 FILE | zstd --long=27 -o NEW",
        )
    if isinstance(issue.cause, CutStreamError) or issue.kind in _CUT:  # a gzip one too (review)
        return TruncatedError(
            str(issue.cause) if isinstance(issue.cause, CutStreamError) else issue.message,
            path=path,
            hint="The file is cut short: copy or upload it again (gzip -t, zstd -t check it)",
        )
    return FormatError(f"cannot read: {issue.cause}", path=path)


def _line_blocks(
    unit: Unit,
    source: Source,
    source_index: int,
    *,
    block_size: int,
    start_block: int,
    hint: int,
    text_field: str,
    on_error: str,
    max_line_bytes: int,
) -> Iterator[Block]:
    end = unit.end if unit.end >= 0 and source.cut is Cut.BYTES else None
    handle, raw = _open(source)
    if not handle.seekable():
        hint = -1  # a zstd stream cannot seek: a resume reads the unit from its start
    if hint >= 0:
        handle.seek(hint)
        start, to_discard, skip_before_next = hint, 0, 0
    else:  # a range owns the lines that start inside it
        start = line_start(handle, unit.begin) if unit.begin > 0 else 0
        to_discard, skip_before_next = start_block * block_size, unit.phase
    lines = stream_lines(handle, raw, source.reader, max_line_bytes, stop=None if end is None else end - start)
    try:
        block = Block(start_block, -1)
        for record in line_records(lines, source.path, offset=start):
            if isinstance(record, Issue):
                if record.kind is IssueKind.EMPTY_FILE:
                    continue
                raise _stream_error(record, source.path)
            offset = record.offset or 0
            if record.value is None:  # a line over the cap
                if on_error != "skip":
                    raise RecordError(
                        f"line has {record.size} bytes, over the cap of {max_line_bytes} bytes",
                        path=source.path,
                        offset=offset,
                        field="max_line_bytes",
                        hint="Pass a larger max_line_bytes= if the record is genuine, or on_error='skip' "
                        "to count and skip such records",
                    )
            else:
                if offset == 0 and record.value.lstrip()[:1] == b"[":
                    raise FormatError(
                        "a JSON array file: the streaming reader needs JSON lines (one object per line)",
                        path=source.path,
                        hint="Convert it to jsonl, or pass load_dataset(..., streaming=True) as the dataset",
                    )
                if not record.value.strip():
                    continue
            if skip_before_next:
                skip_before_next -= 1
                continue
            skip_before_next = unit.stride - 1
            if to_discard:
                to_discard -= 1
                continue
            text: str | None = None  # a skipped bad record (on_error="skip")
            if record.value is not None:
                try:
                    value = orjson.loads(record.value)
                except orjson.JSONDecodeError as exc:
                    if on_error != "skip":
                        raise RecordError(
                            f"not valid JSON: {exc}",
                            path=source.path,
                            offset=offset,
                            hint="Fix the line, or pass on_error='skip' to count and skip such records",
                        ) from None
                else:
                    text = text_of(value, text_field, on_error, path=source.path, offset=offset, row=None)
            if block.hint < 0:
                block.hint = offset
            block.doc_ids.append(source_index << SOURCE_SHIFT | offset)
            block.texts.append(text)
            if len(block.texts) == block_size:
                yield block
                block = Block(block.index + 1, -1)
        if block.texts:
            yield block
    except OSError as exc:  # a read that fails below the decompressor (a lost file, a network error)
        raise FormatError(f"cannot read: {exc}", path=source.path) from None


def _rows_blocks(
    rows: Iterator[tuple[int, Any]],
    unit: Unit,
    *,
    block_size: int,
    start_block: int,
    text_field: str,
    on_error: str,
    path: str,
    source_index: int,
) -> Iterator[Block]:
    """Blocks over (row number, record) pairs: parquet row groups and HF shards."""
    kept = 0
    to_discard = start_block * block_size
    block = Block(start_block, -1)
    for row, record in rows:
        if row % unit.stride != unit.phase:
            continue
        kept += 1
        if kept <= to_discard:
            continue
        block.doc_ids.append(source_index << SOURCE_SHIFT | row)
        block.texts.append(text_of(record, text_field, on_error, path=path, offset=None, row=row))
        if len(block.texts) == block_size:
            yield block
            block = Block(block.index + 1, -1)
    if block.texts:
        yield block


def _file_rows(source: Source, group: int, text_field: str) -> Iterator[tuple[int, Any]]:
    """(0-based row, record) of one row group, the record holding only ``text_field``."""
    try:
        rows = open_rows(source)
        if text_field not in rows.schema.names:
            raise MissingKeyError(
                f"column {text_field!r} is absent, the file has {rows.schema.names}",
                path=source.path,
                field=text_field,
                hint="Pass the right text_field",
            )
        records = list(row_records(rows, range(group, group + 1), source.path, [text_field]))
    except (OSError, ValueError) as exc:
        if isinstance(exc, DataError):
            raise
        raise FormatError(f"cannot read row group {group}: {exc}", path=source.path) from None
    return ((record.line - 1, record.value) for record in records)


def read_blocks(
    unit: Unit,
    source: Source,
    source_index: int,
    *,
    block_size: int,
    start_block: int,
    hint: int,
    text_field: str,
    on_error: str,
    hf_dataset: Any = None,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> Iterator[Block]:
    options = {"block_size": block_size, "start_block": start_block, "text_field": text_field, "on_error": on_error}
    if source.kind != SourceKind.HF and not source.reader.rows:
        yield from _line_blocks(unit, source, source_index, hint=hint, max_line_bytes=max_line_bytes, **options)
        return
    if source.kind != SourceKind.HF:
        rows = _file_rows(source, unit.begin, text_field)
    else:
        shard = hf_dataset.shard(num_shards=hf_dataset.num_shards, index=source_index, contiguous=True)
        rows = enumerate(shard)
    yield from _rows_blocks(rows, unit, path=source.path, source_index=source_index, **options)
