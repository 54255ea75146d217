"""Sub-file units: a large input cut into pieces that nodes encode independently.

    uncompressed .jsonl larger than unit_bytes -> line-aligned byte ranges: the cut k sits at the
        first line start at or after k * unit_bytes (seek there, read to the next newline)
    parquet larger than unit_bytes             -> runs of whole row groups of about unit_bytes
        (compressed sizes from the footer)
    anything else (.gz, .zst, .json.gz, Arrow)  -> the whole file (a compressed stream cannot be
        entered in the middle)

The cuts depend only on the file's bytes and ``unit_bytes``, so every node computes the same
plan from the same inputs; a file changed since the plan changes its size or mtime (or hash),
which the run key already holds, so it is a ResumeMismatchError naming the file.
"""

from __future__ import annotations

import io
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenloom.tokenize._fetch import local_path, named_by_url
from tokenloom.tokenize._sniff import InputKind, require_corpus_extra, sniff

if TYPE_CHECKING:
    from tokenloom.tokenize._inputs import InputFile

__all__ = ["ByteRange", "Part", "RangeReader", "RowGroups", "UnitSource", "cut_units", "lines_before"]


@dataclass(frozen=True, slots=True)
class ByteRange:
    """Bytes ``[start, stop)`` of an uncompressed jsonl file; both ends are line starts (or the end of the file)."""

    start: int
    stop: int

    def to_json(self) -> dict[str, object]:
        return {"bytes": [self.start, self.stop]}

    def label(self) -> str:
        return f"bytes {self.start}-{self.stop}"


@dataclass(frozen=True, slots=True)
class RowGroups:
    """Row groups ``[first, stop)`` of a parquet file."""

    first: int
    stop: int

    def to_json(self) -> dict[str, object]:
        return {"row_groups": [self.first, self.stop]}

    def label(self) -> str:
        return f"row groups {self.first}-{self.stop - 1}"


Part = ByteRange | RowGroups


@dataclass(frozen=True, slots=True)
class UnitSource:
    """What one unit reads: input file ``file_index`` of the run, whole (``part`` None) or a part of it."""

    file_index: int
    file: InputFile
    part: Part | None = None

    @property
    def label(self) -> str:
        return self.file.relative if self.part is None else f"{self.file.relative} [{self.part.label()}]"

    def to_json(self) -> dict[str, object]:
        return {"input": self.file.relative, **(self.part.to_json() if self.part is not None else {})}


def _line_cuts(path: Path, size: int, unit_bytes: int) -> list[int]:
    """Line starts at or after each multiple of ``unit_bytes`` (deduplicated), plus 0 and ``size``."""
    cuts = [0]
    reached = 0  # the end of the last line scanned
    with open(path, "rb") as handle:
        for target in range(unit_bytes, size, unit_bytes):
            if target <= reached:
                continue  # a line longer than unit_bytes already covers this target
            handle.seek(target - 1)  # from the byte before: a target that is already a line start stays one
            while (piece := handle.readline(1 << 20)) and not piece.endswith(b"\n"):
                pass  # a MiB at a time: a line of gigabytes is never held whole
            cut = reached = handle.tell()
            if cut < size and cut > cuts[-1]:
                cuts.append(cut)
    cuts.append(size)
    return cuts


def _row_group_runs(path: Path, kind: InputKind, unit_bytes: int) -> list[tuple[int, int]]:
    pq = require_corpus_extra("pyarrow.parquet", kind)
    pa = require_corpus_extra("pyarrow", kind)
    try:
        metadata: Any = pq.ParquetFile(path).metadata
    except (OSError, pa.ArrowException):
        return []  # unreadable footer: one whole-file unit, whose reading names the error
    runs: list[tuple[int, int]] = []
    first, size = 0, 0
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        size += sum(row_group.column(c).total_compressed_size for c in range(row_group.num_columns))
        if size >= unit_bytes:
            runs.append((first, group + 1))
            first, size = group + 1, 0
    if first < metadata.num_row_groups:
        runs.append((first, metadata.num_row_groups))
    return runs


def cut_units(files: list[InputFile], unit_bytes: int | None) -> list[UnitSource]:
    """The units of ``files`` in order: whole files, or parts of files larger than ``unit_bytes`` (None: never cut)."""
    units: list[UnitSource] = []
    for index, info in enumerate(files):
        if unit_bytes is None or info.size <= unit_bytes:
            units.append(UnitSource(index, info))
            continue
        path = local_path(info)
        with named_by_url(info):
            kind = info.kind or sniff(path)
            runs = _row_group_runs(path, kind, unit_bytes) if kind is InputKind.PARQUET else []
        if kind is InputKind.JSONL:
            cuts = _line_cuts(path, info.size, unit_bytes)
            units.extend(UnitSource(index, info, ByteRange(a, b)) for a, b in itertools.pairwise(cuts))
        elif kind is InputKind.PARQUET and len(runs) > 1:
            units.extend(UnitSource(index, info, RowGroups(a, b)) for a, b in runs)
        else:
            units.append(UnitSource(index, info))
    return units


class RangeReader(io.RawIOBase):
    """Bytes ``[start, stop)`` of a file, read as a stream of their own (position 0 = ``start``)."""

    def __init__(self, path: Path, start: int, stop: int) -> None:
        self._handle = open(path, "rb")  # noqa: SIM115 (closed with this reader)
        self._handle.seek(start)
        self._left = stop - start
        self._read = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer)
        size = self._handle.readinto(view[: min(len(view), self._left)]) or 0
        self._left -= size
        self._read += size
        return size

    def tell(self) -> int:
        return self._read

    def close(self) -> None:
        self._handle.close()
        super().close()


def lines_before(path: Path, offset: int) -> int:
    """How many lines of ``path`` end before byte ``offset`` (a unit's line numbers are counted from there)."""
    count = 0
    with open(path, "rb") as handle:
        left = offset
        while left > 0 and (block := handle.read(min(left, 8 << 20))):
            count += block.count(b"\n")
            left -= len(block)
    return count
