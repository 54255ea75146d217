"""Parquet: rows in row groups; a large file is cut into runs of whole row groups (sizes from the footer)."""

from __future__ import annotations

from typing import Any

from tokenloom.tokenize.inputs._registry import Cut, InputReader, register, require_corpus_extra
from tokenloom.tokenize.inputs._rows import unreadable

__all__ = ["PARQUET", "ParquetRows"]


class ParquetRows:
    """A parquet file's row groups as units (a :class:`~tokenloom.tokenize.inputs.RowFile`)."""

    def __init__(self, source: Any, *, shown: Any = None, **options: Any) -> None:
        pq = require_corpus_extra("pyarrow.parquet", PARQUET)
        self._errors = (OSError, require_corpus_extra("pyarrow", PARQUET).ArrowException)
        self.shown = shown if shown is not None else source
        try:
            self.file: Any = pq.ParquetFile(source, **options)
            self.metadata = self.reusable = metadata = self.file.metadata  # reusable: see open_remote
            self.units = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
            self.schema = self.file.schema_arrow
        except self._errors as exc:
            raise unreadable(PARQUET, "the footer (schema and row-group index)", exc, self.shown, 1) from None

    def unit_bytes(self, unit: int) -> int:
        group = self.metadata.row_group(unit)
        return sum(group.column(c).total_compressed_size for c in range(group.num_columns))

    def read(self, unit: int, columns: list[str] | None = None) -> Any:
        try:
            return self.file.read_row_group(unit, columns=columns)
        except self._errors as exc:
            first = sum(self.units[:unit]) + 1
            what = f"row group {unit} (of {len(self.units)}, rows {first}-{first + self.units[unit] - 1})"
            raise unreadable(PARQUET, what, exc, self.shown, first) from None


class _Parquet(InputReader):
    name = "parquet"
    suffixes = (".parquet",)
    magic = (b"PAR1",)
    trailer = b"PAR1"
    rows = True
    cut = Cut.ROW_GROUPS

    def open(self, source: Any, **options: Any) -> ParquetRows:
        """``source``: a path or a binary file object; ``options`` go to ``pyarrow.parquet.ParquetFile``."""
        options.setdefault("page_checksum_verification", True)
        return ParquetRows(source, **options)

    def open_remote(self, source: Any, *, shown: Any, reuse: Any = None) -> ParquetRows:
        """Over ranged reads: the footer parsed once per object (``reuse``), a row group's column chunks fetched
        together (``pre_buffer``): a row group then costs one ranged GET."""
        return self.open(source, shown=shown, metadata=reuse, pre_buffer=True)


PARQUET = register(_Parquet())
