"""Arrow IPC (file or stream layout; a ``datasets`` ``save_to_disk`` directory holds such files): record batches."""

from __future__ import annotations

from typing import Any

from tokenloom.tokenize.inputs._registry import InputReader, register, require_corpus_extra
from tokenloom.tokenize.inputs._rows import unreadable

__all__ = ["ARROW", "ArrowRows"]

FILE_MAGIC = b"ARROW1"


class ArrowRows:
    """An Arrow IPC file's record batches as units (a :class:`~tokenloom.tokenize.inputs.RowFile`), read whole."""

    def __init__(self, source: Any, *, shown: Any = None) -> None:
        pa = require_corpus_extra("pyarrow", ARROW)
        try:
            mapped = source if hasattr(source, "read") else pa.memory_map(str(source))
            head = mapped.read(6)
            mapped.seek(0)
            if head == FILE_MAGIC:
                reader = pa.ipc.open_file(mapped)
                self._batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            else:
                reader = pa.ipc.open_stream(mapped)
                self._batches = list(reader)
        except (OSError, pa.ArrowException) as exc:
            raise unreadable(ARROW, "a record batch", exc, shown if shown is not None else source, 1) from None
        self.schema = reader.schema
        self.units = [batch.num_rows for batch in self._batches]

    def unit_bytes(self, unit: int) -> int:
        return int(self._batches[unit].nbytes)

    def read(self, unit: int, columns: list[str] | None = None) -> Any:
        batch = self._batches[unit]
        return batch if columns is None else batch.select(columns)


class _Arrow(InputReader):
    name = "Arrow IPC"
    suffixes = (".arrow",)
    magic = (FILE_MAGIC, b"\xff\xff\xff\xff")
    rows = True

    def open(self, source: Any, **options: Any) -> ArrowRows:
        return ArrowRows(source, **options)


ARROW = register(_Arrow())
