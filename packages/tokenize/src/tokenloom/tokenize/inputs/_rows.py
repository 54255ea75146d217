"""Row inputs (parquet, Arrow IPC): the text column, cut into deterministic row ranges.

A row file's units are its row groups or record batches (:class:`RowFile`, opened by its
reader). A unit of more than ``chunk_rows`` rows is cut into fixed ranges of ``chunk_rows``,
so the pieces of a file depend only on its layout and that number, whatever the worker count;
resume skips whole units unread.

``--text-field a.b`` names a struct column ``a`` and its field ``b``. A column
the schema lacks, or that is not a string, is an error before any row is read;
a null anywhere on the path is one bad record, counted and named like a jsonl
line without the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tokenloom.formats import FormatError, MissingKeyError
from tokenloom.tokenize.inputs._registry import InputReader, require_corpus_extra

__all__ = ["ColumnarFile", "ColumnarPiece", "RowFile", "unreadable"]


class RowFile(Protocol):
    """An open row input: ``units[i]`` rows in unit i (a row group or record batch); a damaged unit's ``read``
    is a FormatError naming the file and its rows."""

    units: list[int]
    schema: Any
    """Its Arrow schema."""

    def unit_bytes(self, unit: int) -> int: ...

    def read(self, unit: int, columns: list[str] | None = None) -> Any: ...


@dataclass(slots=True)
class ColumnarPiece:
    """The texts of rows ``first_row ..`` (1-based, in the file) of one unit; None where a row has no usable text."""

    first_row: int
    texts: list[str | None]
    missing: list[int]
    """Offsets (into ``texts``) of rows where a struct on the text field's path is null."""
    text_bytes: int
    source_bytes: int


def _check_schema(schema: Any, text_field: tuple[str, ...], path: Path, pa: Any) -> None:
    """The text field must name a string column (through struct columns): a MissingKeyError naming the columns."""
    dotted = ".".join(text_field)
    names = list(schema.names)
    if text_field[0] not in names:
        shown = ", ".join(repr(n) for n in names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
        raise MissingKeyError(
            f"the file has no column {text_field[0]!r} (looking for --text-field {dotted!r}); "
            + (f"its columns are {shown}" if names else "it has no columns at all"),
            path=path,
            field="text_field",
            hint="Pass --text-field with the column that holds the text (a dotted path for a struct field)",
        )
    kind = schema.field(text_field[0]).type
    for depth, key in enumerate(text_field[1:], start=1):
        fields = [kind.field(i).name for i in range(kind.num_fields)] if pa.types.is_struct(kind) else []
        if key not in fields:
            where = ".".join(text_field[:depth])
            holds = f"a struct with fields {', '.join(map(repr, fields))}" if fields else f"of type {kind}"
            raise MissingKeyError(
                f"column {where!r} is {holds}, with no field {key!r} (looking for --text-field {dotted!r})",
                path=path,
                field="text_field",
                hint="Pass --text-field with the path of the text (struct fields joined by dots)",
            )
        kind = kind.field(key).type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        raise MissingKeyError(
            f"column {dotted!r} is of type {kind}, expected a string column",
            path=path,
            field="text_field",
            hint="Pass --text-field with the column that holds the text",
        )


def _texts(columns: Any, text_field: tuple[str, ...], pa: Any, pc: Any) -> tuple[list[str | None], list[int], int]:
    """Texts, rows with a null struct on the path, and the texts' UTF-8 bytes, of one table or record batch."""
    column = columns.column(text_field[0])
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    missing_mask = None
    for key in text_field[1:]:
        if column.null_count:
            nulls = column.is_null()
            missing_mask = nulls if missing_mask is None else pc.or_(missing_mask, nulls)
        column = pc.struct_field(column, key)
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    text_bytes = pc.sum(pc.binary_length(column)).as_py() or 0
    missing = [] if missing_mask is None else [i for i, flag in enumerate(missing_mask.to_pylist()) if flag]
    return column.to_pylist(), missing, int(text_bytes)


def unreadable(kind: InputReader, what: str, exc: BaseException, path: Any, first_row: int) -> FormatError:
    return FormatError(
        f"{what} of this {kind.name} file cannot be read ({type(exc).__name__}: {' '.join(str(exc).split())})",
        path=path,
        record=first_row,
        hint="The file is corrupt or cut short: copy or download it again (nothing was published)",
    )


def _cuts(units: list[int], chunk_rows: int) -> list[tuple[int, int, int, int]]:
    """(unit, start, stop, first row of the file, 0-based) of every piece, in order."""
    cuts, row = [], 0
    for unit, rows in enumerate(units):
        cuts.extend((unit, start, min(start + chunk_rows, rows), row + start) for start in range(0, rows, chunk_rows))
        row += rows
    return cuts


class ColumnarFile:
    """One row file: its schema checked, its pieces known; :meth:`read` decodes one piece."""

    def __init__(
        self,
        path: Path,
        kind: InputReader,
        text_field: tuple[str, ...],
        *,
        chunk_rows: int,
        row_groups: tuple[int, int] | None = None,
    ) -> None:
        self.path, self.kind, self.text_field = path, kind, text_field
        self._pa = require_corpus_extra("pyarrow", kind)
        self._pc = require_corpus_extra("pyarrow.compute", kind)
        self._size = path.stat().st_size
        self._rows: RowFile = kind.open(path)
        _check_schema(self._rows.schema, text_field, path, self._pa)
        units = self._units = self._rows.units
        self.cuts = _cuts(units, chunk_rows)
        """(unit, start, stop, first row) of each piece: row groups or record batches cut at ``chunk_rows`` rows."""
        if row_groups is not None:  # a sub-file unit: only these row groups (rows keep their numbers in the file)
            self.cuts = [cut for cut in self.cuts if row_groups[0] <= cut[0] < row_groups[1]]
        self._total_rows = sum(units) or 1
        self._loaded_unit: int = -1
        self._loaded: Any = None

    def _unit(self, unit: int) -> Any:
        if self._loaded is None or unit != self._loaded_unit:
            self._loaded = self._rows.read(unit, [self.text_field[0]])
            self._loaded_unit = unit
        return self._loaded

    def read(self, number: int) -> ColumnarPiece:
        """Piece ``number``: its texts, the rows without the field and its share of the file's bytes."""
        unit, start, stop, row = self.cuts[number]
        loaded = self._unit(unit)
        size, total = self._size, self._total_rows
        source_bytes = size * (row + stop - start) // total - size * row // total
        try:
            texts, missing, text_bytes = _texts(loaded.slice(start, stop - start), self.text_field, self._pa, self._pc)
        except (UnicodeDecodeError, self._pa.ArrowException) as exc:
            what = f"the text of rows {row + 1}-{row + stop - start}"
            raise unreadable(self.kind, what, exc, self.path, row + 1) from None
        return ColumnarPiece(row + 1, texts, missing, text_bytes, source_bytes)
