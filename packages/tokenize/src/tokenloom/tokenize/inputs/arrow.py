"""Arrow IPC (file or stream layout; a ``datasets`` ``save_to_disk`` directory holds such files): record batches.

Opening reads only the messages' metadata (a few hundred bytes per batch; each batch's body is skipped by a
seek), so a file of any size opens in bounded memory; :meth:`ArrowRows.read` then reads one batch.
"""

from __future__ import annotations

import struct
from contextlib import AbstractContextManager, nullcontext
from typing import Any, BinaryIO

from tokenloom.tokenize.inputs._registry import InputReader, register, require_corpus_extra
from tokenloom.tokenize.inputs._rows import unreadable

__all__ = ["ARROW", "ArrowRows"]

FILE_MAGIC = b"ARROW1"
_CONTINUATION = b"\xff\xff\xff\xff"
#: Message.header_type (Arrow's Message.fbs: Schema 1, DictionaryBatch 2, RecordBatch 3)
_DICTIONARY_BATCH, _RECORD_BATCH = 2, 3
#: Bytes read at each message's start: its length prefix and, for a few columns, all of its metadata (one read,
#: one ranged GET over object storage)
_PEEK = 512


class ArrowRows:
    """An Arrow IPC file's record batches as units (a :class:`~tokenloom.tokenize.inputs.RowFile`): their row
    counts and sizes from the messages' metadata, a batch read when asked for."""

    def __init__(self, source: Any, *, shown: Any = None) -> None:
        self._pa = pa = require_corpus_extra("pyarrow", ARROW)
        self._shown = shown if shown is not None else source
        self._source = source
        self._whole: list[Any] | None = None
        try:
            with self._open():
                try:
                    self._scan_file()
                except _LateDictionary:  # a batch alone would decode with the wrong dictionary: pyarrow reads all
                    self._whole = self._read_whole()
        except (OSError, ValueError, struct.error, pa.ArrowException) as exc:
            raise unreadable(ARROW, "a record batch", exc, self._shown, 1) from None
        if self._whole is not None:
            self.units = [batch.num_rows for batch in self._whole]
        else:
            self.units = [rows for _, _, rows, _ in self._batches]

    def _read_whole(self) -> list[Any]:
        """Every batch through pyarrow's own reader (a file whose dictionaries change between batches)."""
        self._file.seek(0)
        head = self._file.read(6)
        self._file.seek(0)
        reader = self._pa.ipc.open_file(self._file) if head == FILE_MAGIC else self._pa.ipc.open_stream(self._file)
        self.schema = reader.schema
        if head == FILE_MAGIC:
            return [reader.get_batch(i) for i in range(reader.num_record_batches)]
        return list(reader)

    def _open(self) -> AbstractContextManager[BinaryIO]:
        """The source (a file object, kept open by its owner) or the file at its path, open while in use."""
        self._file: BinaryIO = self._source if hasattr(self._source, "read") else open(self._source, "rb")  # noqa: SIM115
        return nullcontext(self._file) if self._file is self._source else self._file

    def _scan_file(self) -> None:
        """The batches' places and row counts, and the schema (and dictionary) messages before them."""
        pa = self._pa
        head = self._read_at(0, 8)
        size = self._file.seek(0, 2)
        start, end = (8, size - 10 - self._footer_length(size)) if head[:6] == FILE_MAGIC else (0, size)
        self._batches = self._scan(start, end)
        first = self._batches[0][0] if self._batches else end
        self._prefix = self._read_at(start, first - start)  # the schema (and dictionary) messages
        self.schema = pa.ipc.open_stream(self._prefix + b"\xff\xff\xff\xff\x00\x00\x00\x00").schema

    def _read_at(self, offset: int, length: int) -> bytes:
        self._file.seek(offset)
        data = self._file.read(length)
        if len(data) != length:
            raise ValueError(f"{length} bytes expected at byte {offset}, the file ends after {len(data)}")
        return data

    def _footer_length(self, size: int) -> int:
        tail = self._read_at(size - 10, 10)
        if tail[4:] != FILE_MAGIC:
            raise ValueError("the file does not end with the ARROW1 magic: its footer is missing")
        return struct.unpack("<i", tail[:4])[0]

    def _scan(self, offset: int, end: int) -> list[tuple[int, int, int, int]]:
        """(offset, length, rows, body bytes) of every record batch message from ``offset`` to ``end``."""
        batches = []
        while offset + 8 <= end:
            head = self._read_at(offset, min(_PEEK, end - offset))
            skip = 8 if head[:4] == _CONTINUATION else 4  # 4: the format before Arrow 0.15, a bare length
            meta_length = struct.unpack_from("<i", head, skip - 4)[0]
            if meta_length == 0:  # end of stream
                break
            meta = head[skip : skip + meta_length]
            if len(meta) < meta_length:  # a long one (many columns): one more read
                meta = self._read_at(offset + skip, meta_length)
            kind, rows, body = _message(meta)
            length = skip + meta_length + body
            if offset + length > end:
                raise ValueError(f"the message at byte {offset} needs {length} bytes, the data ends at byte {end}")
            if kind == _RECORD_BATCH:
                batches.append((offset, length, rows, body))
            elif kind == _DICTIONARY_BATCH and batches:  # a delta or replacement dictionary
                raise _LateDictionary
            offset += length
        return batches

    def unit_bytes(self, unit: int) -> int:
        return int(self._whole[unit].nbytes) if self._whole is not None else self._batches[unit][3]

    def read(self, unit: int, columns: list[str] | None = None) -> Any:
        if self._whole is not None:
            batch = self._whole[unit]
            return batch if columns is None else batch.select(columns)
        offset, length, rows, _ = self._batches[unit]
        try:
            with self._open():
                batch = self._pa.ipc.open_stream(self._prefix + self._read_at(offset, length)).read_next_batch()
        except (OSError, ValueError, StopIteration, self._pa.ArrowException) as exc:
            first = sum(self.units[:unit]) + 1
            what = f"record batch {unit} (of {len(self.units)}, rows {first}-{first + rows - 1})"
            raise unreadable(ARROW, what, exc, self._shown, first) from None
        return batch if columns is None else batch.select(columns)


class _LateDictionary(Exception):
    """A dictionary message after the first record batch: batches cannot be read one by one."""


def _message(meta: bytes) -> tuple[int, int, int]:
    """(header type, rows of a record batch, body bytes) of an IPC message's flatbuffer (Arrow's Message.fbs)."""
    message = _table(meta, struct.unpack_from("<I", meta)[0])
    kind = meta[message[1]] if message[1] else 0
    body = struct.unpack_from("<q", meta, message[3])[0] if message[3] else 0
    rows = 0
    if kind == _RECORD_BATCH and message[2]:
        header = message[2] + struct.unpack_from("<I", meta, message[2])[0]
        length = _table(meta, header)[0]
        rows = struct.unpack_from("<q", meta, length)[0] if length else 0
    return kind, rows, body


def _table(buffer: bytes, position: int) -> list[int]:
    """The absolute position of each field of the flatbuffer table at ``position`` (0: field absent)."""
    vtable = position - struct.unpack_from("<i", buffer, position)[0]
    size = struct.unpack_from("<H", buffer, vtable)[0]
    offsets = struct.unpack_from(f"<{(size - 4) // 2}H", buffer, vtable + 4)
    return [position + field if field else 0 for field in (*offsets, 0, 0, 0, 0)]


class _Arrow(InputReader):
    name = "Arrow IPC"
    suffixes = (".arrow",)
    magic = (FILE_MAGIC, b"\xff\xff\xff\xff")
    rows = True

    def open(self, source: Any, **options: Any) -> ArrowRows:
        return ArrowRows(source, **options)


ARROW = register(_Arrow())
