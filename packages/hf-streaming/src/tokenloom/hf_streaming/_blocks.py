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
import operator
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import orjson

from tokenloom.formats import DataError, FormatError, MissingKeyError, RecordError, RemoteOptions, TruncatedError
from tokenloom.hf_streaming._remote import RangeReader
from tokenloom.hf_streaming._units import HF, Source, Unit, open_rows
from tokenloom.tokenize.inputs import (
    Cut,
    CutStreamError,
    Issue,
    IssueKind,
    WindowError,
    line_start,
    row_records,
    stream_lines,
)

__all__ = ["DEFAULT_MAX_LINE_BYTES", "READ_BYTES", "SOURCE_SHIFT", "Block", "Reading", "read_blocks", "text_of"]

SOURCE_SHIFT = 40
DEFAULT_MAX_LINE_BYTES = 64 << 20
"""A jsonl line longer than this is a bad record, never read whole (tokenize and pack use the same cap)."""
READ_BYTES = 4 << 20
"""Bytes per ranged GET of a remote line stream."""


@dataclass(frozen=True, slots=True)
class Reading:
    """How a unit's records become blocks: one value from the dataset to every reader."""

    block_size: int
    """Records per shuffled block (``shuffle_buffer_size``)."""
    text_field: str
    on_error: str
    """``"raise"`` (a RecordError naming the file and offset or row) or ``"skip"`` (counted)."""
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES


@dataclass(slots=True)
class Block:
    index: int
    hint: int
    doc_ids: np.ndarray
    """int64, one per record."""
    texts: list[str | None]
    """None where a bad record was skipped (``on_error="skip"``)."""


class _Filler:
    """Records, a run at a time, cut into blocks of ``size``: no per-record Python on the way."""

    __slots__ = ("hint", "ids", "index", "size", "texts")

    def __init__(self, index: int, size: int) -> None:
        self.index, self.size = index, size
        self.hint, self.texts, self.ids = -1, [], []

    def add(self, texts: list[str | None], ids: np.ndarray, offsets: np.ndarray | None = None) -> Iterator[Block]:
        at = 0
        while at < len(texts):
            if self.hint < 0 and offsets is not None:
                self.hint = int(offsets[at])
            take = min(self.size - len(self.texts), len(texts) - at)
            self.texts.extend(texts[at : at + take] if take < len(texts) else texts)
            self.ids.append(ids[at : at + take])
            at += take
            if len(self.texts) == self.size:
                yield self.flush()

    def flush(self) -> Block:
        ids = np.concatenate(self.ids) if self.ids else np.empty(0, dtype=np.int64)
        block = Block(self.index, self.hint, ids, self.texts)
        self.index, self.hint, self.texts, self.ids = self.index + 1, -1, [], []
        return block


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


def _stream_error(issue: Issue, path: str) -> DataError:
    """A cut or corrupt compressed stream (every issue of a stream but an empty file), or one too wide to decode."""
    if isinstance(issue.cause, WindowError):
        return FormatError(
            str(issue.cause),
            path=path,
            hint="Recompress it with a window of 128 MiB or less: zstd -dc --long=31 FILE | zstd --long=27 -o NEW",
        )
    return TruncatedError(
        str(issue.cause) if isinstance(issue.cause, CutStreamError) else issue.message,
        path=path,
        hint="The file is cut short: copy or upload it again (gzip -t, zstd -t check it)",
    )


def _line_blocks(
    unit: Unit, source: Source, source_index: int, *, reading: Reading, start_block: int, hint: int
) -> Iterator[Block]:
    """Blocks of a line unit, a batch of lines (about 1 MiB) at a time: offsets, the stride and the block cuts in
    numpy, the parse in one ``map`` per batch; a batch with a bad record is read again a record at a time."""
    end = unit.end if unit.end >= 0 and source.cut is Cut.BYTES else None
    handle, raw = _open(source)
    if not handle.seekable():
        hint = -1  # a zstd stream cannot seek: a resume reads the unit from its start
    if hint >= 0:
        handle.seek(hint)
        start, to_discard, skip = hint, 0, 0
    else:  # a range owns the lines that start inside it
        start = line_start(handle, unit.begin) if unit.begin > 0 else 0
        to_discard, skip = start_block * reading.block_size, unit.phase
    lines = stream_lines(handle, raw, source.reader, reading.max_line_bytes, stop=None if end is None else end - start)
    blocks, offset, path = _Filler(start_block, reading.block_size), start, source.path
    tag = source_index << SOURCE_SHIFT
    try:
        for batch, sizes, issue in lines:
            if issue is not None:
                if issue.kind is IssueKind.EMPTY_FILE:
                    continue
                if issue.kind is not IssueKind.LINE_TOO_LONG:
                    raise _stream_error(issue, path)
                if reading.on_error != "skip":
                    raise RecordError(
                        f"line has {sizes[0]} bytes, over the cap of {reading.max_line_bytes} bytes",
                        path=path,
                        offset=offset,
                        field="max_line_bytes",
                        hint="Pass a larger max_line_bytes= if the record is genuine, or on_error='skip' "
                        "to count and skip such records",
                    )
            lengths = np.asarray(sizes, dtype=np.int64)
            offsets = np.cumsum(lengths) - lengths + offset
            offset += int(lengths.sum())
            records = None  # the lines that are records (None: all; a blank line is none)
            good: list[bytes] = []  # the batch's lines when it is a run of good lines (issue None: no None in it)
            if issue is None:
                good = cast("list[bytes]", batch)
                if offsets[0] == 0 and good[0].lstrip()[:1] == b"[":
                    raise FormatError(
                        "a JSON array file: the streaming reader needs JSON lines (one object per line)",
                        path=path,
                        hint="Convert it to jsonl, or pass load_dataset(..., streaming=True) as the dataset",
                    )
                if min(good)[:1] <= b" ":  # an empty or whitespace-led line: look at each
                    records = np.flatnonzero([bool(line.strip()) for line in good])
            count = len(batch) if records is None else records.size
            picks = np.arange(skip, count, unit.stride)  # the unit's share: every stride-th record from its phase
            skip = (int(picks[-1]) + unit.stride if picks.size else skip) - count
            if to_discard:
                dropped = min(to_discard, picks.size)
                picks, to_discard = picks[dropped:], to_discard - dropped
            if not picks.size:
                continue
            index = picks if records is None else records[picks]
            where = offsets[index]
            texts: list[str | None] = [None]  # a skipped over-long line (issue): a record without a text
            error = None
            if issue is None:
                chosen = good if index.size == len(good) else list(map(good.__getitem__, index.tolist()))
                texts, error = _texts(chosen, where, reading, path)
            yield from blocks.add(texts, tag | where[: len(texts)], where)
            if error is not None:
                raise error
        if blocks.texts:
            yield blocks.flush()
    except OSError as exc:  # a read that fails below the decompressor (a lost file, a network error)
        raise FormatError(f"cannot read: {exc}", path=path) from None


def _texts(
    lines: list[bytes], offsets: np.ndarray, reading: Reading, path: str
) -> tuple[list[str | None], DataError | None]:
    """The text of each line, and the error of the first bad one (the texts stop before it); skipped: None."""
    field = reading.text_field
    try:
        texts = list(map(operator.itemgetter(field), map(orjson.loads, lines)))
        if set(map(type, texts)) <= {str}:
            return texts, None
    except (orjson.JSONDecodeError, KeyError, TypeError):
        pass
    texts = []
    for line, offset in zip(lines, offsets.tolist(), strict=True):
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            if reading.on_error == "skip":
                texts.append(None)
                continue
            return texts, RecordError(
                f"not valid JSON: {exc}",
                path=path,
                offset=offset,
                hint="Fix the line, or pass on_error='skip' to count and skip such records",
            )
        try:
            texts.append(text_of(value, field, reading.on_error, path=path, offset=offset, row=None))
        except RecordError as exc:
            return texts, exc
    return texts, None


def _rows_blocks(
    rows: Iterator[tuple[int, Any]], unit: Unit, reading: Reading, start_block: int, path: str, source_index: int
) -> Iterator[Block]:
    """Blocks over (row number, record) pairs: parquet row groups and HF shards."""
    kept = 0
    to_discard = start_block * reading.block_size
    blocks = _Filler(start_block, reading.block_size)
    texts: list[str | None] = []
    ids: list[int] = []
    for row, record in rows:
        if row % unit.stride != unit.phase:
            continue
        kept += 1
        if kept <= to_discard:
            continue
        ids.append(source_index << SOURCE_SHIFT | row)
        texts.append(text_of(record, reading.text_field, reading.on_error, path=path, offset=None, row=row))
        if len(texts) == reading.block_size - len(blocks.texts):
            yield from blocks.add(texts, np.asarray(ids, dtype=np.int64))
            texts, ids = [], []
    yield from blocks.add(texts, np.asarray(ids, dtype=np.int64))
    if blocks.texts:
        yield blocks.flush()


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
    unit: Unit, source: Source, index: int, reading: Reading, *, start_block: int, hint: int, hf_dataset: Any = None
) -> Iterator[Block]:
    """The unit's records as blocks of ``reading.block_size`` from block ``start_block`` on (see the module)."""
    if source.kind != HF and not source.rows:
        yield from _line_blocks(unit, source, index, reading=reading, start_block=start_block, hint=hint)
        return
    if source.rows:
        rows = _file_rows(source, unit.begin, reading.text_field)
    else:
        shard = hf_dataset.shard(num_shards=hf_dataset.num_shards, index=index, contiguous=True)
        rows = enumerate(shard)
    yield from _rows_blocks(rows, unit, reading, start_block, source.path, index)
