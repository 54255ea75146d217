"""Read a unit as blocks of records, seeking where the source allows.

Every reader yields :class:`Block` s of ``block_size`` kept records in source
order, starting at block ``start_block``. ``hint`` is where that block starts
(a byte offset for jsonl, ignored elsewhere): with it a plain jsonl reader seeks
straight there, so resuming costs one block, not the position. A record's
``doc_id`` is a stable global id: ``source << 40 | byte offset`` (jsonl),
``source << 40 | row`` (parquet, HF shards).
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from tokenloom.formats import DataError, FormatError, MissingKeyError, RecordError
from tokenloom.hf_streaming._open import WindowError, open_source
from tokenloom.hf_streaming._parquet import parquet_file
from tokenloom.hf_streaming._units import Source, SourceKind, Unit

__all__ = ["DEFAULT_MAX_LINE_BYTES", "SOURCE_SHIFT", "Block", "read_blocks", "text_of"]

SOURCE_SHIFT = 40
DEFAULT_MAX_LINE_BYTES = 64 << 20
"""A jsonl line longer than this is a bad record, never read whole (tokenize and pack use the same cap)."""
_SKIP_CHUNK = 1 << 20


def _rest_of_line(f: Any, first: bytes) -> int:
    """Read past the end of a line whose first part is ``first``, in bounded chunks; its total size."""
    size, tail = len(first), first
    while tail and not tail.endswith(b"\n"):
        tail = f.readline(_SKIP_CHUNK)
        size += len(tail)
    return size


def _capped_line(f: Any, cap: int) -> tuple[bytes, int]:
    """The next line (with its newline) and its size; b"" and the whole size for a line over ``cap``.

    Read 1 MiB at a time and never joined when over the cap, so a line without end (a decompression
    bomb) costs at most the cap in memory, not its size.
    """
    want = min(cap + 1, _SKIP_CHUNK)
    first = f.readline(want)
    if len(first) < want or first.endswith(b"\n"):
        return first, len(first)
    pieces, size = [first], len(first)
    while size <= cap and not pieces[-1].endswith(b"\n"):
        piece = f.readline(min(cap + 1 - size, _SKIP_CHUNK))
        if not piece:
            break
        pieces.append(piece)
        size += len(piece)
    if size > cap and not (size == cap + 1 and pieces[-1].endswith(b"\n")):
        last = pieces.pop()
        pieces.clear()
        return b"", size - len(last) + _rest_of_line(f, last)
    return b"".join(pieces), size


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


def _jsonl_blocks(
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
    end = unit.end if unit.end >= 0 and not source.compressed else None
    try:
        handle = open_source(source)
    except OSError as exc:
        raise FormatError(f"cannot open: {exc.strerror}", path=source.path) from None
    if source.kind == SourceKind.JSONL_ZST:
        hint = -1  # a zstd stream cannot seek: a resume reads the unit from its start
    with handle as f:
        try:
            if hint >= 0:
                f.seek(hint)
                to_discard = 0
                skip_before_next = 0
            else:
                if unit.begin > 0:
                    f.seek(unit.begin - 1)
                    _rest_of_line(f, f.readline(_SKIP_CHUNK))  # a range owns the lines that start inside it
                to_discard = start_block * block_size
                skip_before_next = unit.phase
            block = Block(start_block, -1)
            while True:
                offset = f.tell()
                if end is not None and offset >= end:
                    break
                line, size = _capped_line(f, max_line_bytes)
                if not size:
                    break
                too_long = not line
                if too_long:
                    if on_error != "skip":
                        raise RecordError(
                            f"line has {size} bytes, over the cap of {max_line_bytes} bytes",
                            path=source.path,
                            offset=offset,
                            field="max_line_bytes",
                            hint="Pass a larger max_line_bytes= if the record is genuine, or on_error='skip' "
                            "to count and skip such records",
                        )
                else:
                    if offset == 0 and line.lstrip()[:1] == b"[":
                        raise FormatError(
                            "a JSON array file: the streaming reader needs JSON lines (one object per line)",
                            path=source.path,
                            hint="Convert it to jsonl, or pass load_dataset(..., streaming=True) as the dataset",
                        )
                    if not line.strip():
                        continue
                if skip_before_next:
                    skip_before_next -= 1
                    continue
                skip_before_next = unit.stride - 1
                if to_discard:
                    to_discard -= 1
                    continue
                text: str | None = None  # a skipped bad record (on_error="skip")
                if not too_long:
                    try:
                        record = orjson.loads(line)
                    except orjson.JSONDecodeError as exc:
                        if on_error != "skip":
                            raise RecordError(
                                f"not valid JSON: {exc}",
                                path=source.path,
                                offset=offset,
                                hint="Fix the line, or pass on_error='skip' to count and skip such records",
                            ) from None
                    else:
                        text = text_of(record, text_field, on_error, path=source.path, offset=offset, row=None)
                if block.hint < 0:
                    block.hint = offset
                block.doc_ids.append(source_index << SOURCE_SHIFT | offset)
                block.texts.append(text)
                if len(block.texts) == block_size:
                    yield block
                    block = Block(block.index + 1, -1)
            if block.texts:
                yield block
        except WindowError as exc:
            raise FormatError(
                str(exc),
                path=source.path,
                hint="Recompress it with a window of 128 MiB or less: zstd -dc --long=31 FILE | zstd --long=27 -o NEW",
            ) from None
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
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


def _parquet_rows(source: Source, group: int, text_field: str) -> Iterator[tuple[int, Any]]:
    try:
        parquet = parquet_file(source)
        if text_field not in parquet.schema_arrow.names:
            raise MissingKeyError(
                f"column {text_field!r} is absent, the file has {parquet.schema_arrow.names}",
                path=source.path,
                field=text_field,
                hint="Pass the right text_field",
            )
        column = parquet.read_row_group(group, columns=[text_field]).column(0).to_pylist()
    except (OSError, ValueError) as exc:
        if isinstance(exc, DataError):
            raise
        raise FormatError(f"cannot read row group {group}: {exc}", path=source.path) from None
    first = sum(source.row_groups[:group])
    for i, value in enumerate(column):
        yield first + i, {text_field: value}


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
    if source.kind in (SourceKind.JSONL, SourceKind.JSONL_GZ, SourceKind.JSONL_ZST):
        yield from _jsonl_blocks(
            unit,
            source,
            source_index,
            block_size=block_size,
            start_block=start_block,
            hint=hint,
            text_field=text_field,
            on_error=on_error,
            max_line_bytes=max_line_bytes,
        )
        return
    if source.kind == SourceKind.PARQUET:
        rows = _parquet_rows(source, unit.begin, text_field)
    else:
        shard = hf_dataset.shard(num_shards=hf_dataset.num_shards, index=source_index, contiguous=True)
        rows = enumerate(shard)
    yield from _rows_blocks(
        rows,
        unit,
        block_size=block_size,
        start_block=start_block,
        text_field=text_field,
        on_error=on_error,
        path=source.path,
        source_index=source_index,
    )
