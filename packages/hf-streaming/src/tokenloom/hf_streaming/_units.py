"""Source shards ("units"): the pieces of work dealt to rank x worker slots.

A unit is a file, a byte range of a plain jsonl file, a parquet row group or a
shard of a Hugging Face ``IterableDataset``, optionally strided by example
(``stride`` > 1 keeps every ``stride``-th record starting at ``phase``). What a file
holds and how it may be cut is its input reader's (``tokenloom.tokenize.inputs``). The unit
list is a pure function of the sources and a :class:`Layout`; the layout is
chosen once, at the first start, so that there are at least as many units as
slots where the sources allow, and is stored in every state so that a resume on
another topology sees the same units.
"""

from __future__ import annotations

import glob
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenloom.formats import ConfigError, DataError, FormatError, MissingFileError, RemoteOptions
from tokenloom.formats.remote.client import ObjectInfo
from tokenloom.hf_streaming._remote import RangeReader, expand_remote, is_remote_source, stat_remote
from tokenloom.tokenize.inputs import (
    Cut,
    InputReader,
    format_named,
    input_suffixes,
    sniff,
    sniff_file,
)

__all__ = [
    "DEFAULT_UNIT_BYTES",
    "HF",
    "Layout",
    "Source",
    "Unit",
    "choose_layout",
    "enumerate_units",
    "open_rows",
    "unit_count",
    "unit_sizes",
]

log = logging.getLogger("tokenloom.hf_streaming")
DEFAULT_UNIT_BYTES = 64 * 2**20


HF = "hf"
"""The kind of a Hugging Face IterableDataset's shard; a file's kind is its input reader's name."""


@dataclass(frozen=True, slots=True)
class Source:
    """One input: a local file, a remote object, or shard ``index`` of a Hugging Face IterableDataset."""

    kind: str
    """Its input reader's name, or :data:`HF`."""
    path: str
    """The local path or the URL as given (what messages name)."""
    size: int
    """Bytes (0 for an HF shard)."""
    row_groups: tuple[int, ...] = ()
    """Rows per row group (parquet only)."""
    remote: ObjectInfo | None = None
    """A remote object's identity as opened (size, ETag), None for local files."""
    access: RemoteOptions | None = None

    @property
    def reader(self) -> InputReader:
        return format_named(self.kind)

    @property
    def cut(self) -> Cut:
        return Cut.WHOLE if self.kind == HF else self.reader.cut

    @property
    def rows(self) -> bool:
        """A file of table rows (parquet, Arrow): its units are row groups (or record batches)."""
        return self.kind != HF and self.reader.rows


@dataclass(frozen=True, slots=True)
class Unit:
    source: int
    begin: int
    """Byte offset (plain jsonl), row group (parquet), else 0."""
    end: int
    """Byte end (plain jsonl), else -1."""
    stride: int = 1
    phase: int = 0


@dataclass(frozen=True, slots=True)
class Layout:
    """How sources are cut into units: stored in the state, never re-decided on resume."""

    unit_bytes: int = DEFAULT_UNIT_BYTES
    split: int = 1
    """Extra byte ranges per plain jsonl file."""
    stride: int = 1
    """Stride-by-example factor for every unit (only when splitting could not give enough units)."""

    def to_json(self) -> dict[str, int]:
        return {"unit_bytes": self.unit_bytes, "split": self.split, "stride": self.stride}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Layout:
        return cls(unit_bytes=int(data["unit_bytes"]), split=int(data["split"]), stride=int(data["stride"]))


def _reader_of(path: str, remote: ObjectInfo | None, access: RemoteOptions) -> InputReader:
    """A file's reader by its magic bytes, its suffix cross-checked (the input room's one rule); a remote
    object's first and last bytes come by ranged reads."""
    if remote is None:
        return sniff(Path(path))
    with RangeReader(remote, access) as handle:
        return sniff_file(handle, path.rsplit("/", 1)[-1], path)


def data_suffixes() -> tuple[str, ...]:
    """What a remote prefix (a dataset path) is expanded to: every reader's suffixes, and ``.json``."""
    return (".json", *input_suffixes())


def resolve_files(data_files: Any, split: str, access: RemoteOptions | None = None) -> list[str]:
    """``data_files`` as ``load_dataset`` takes it (str, list, {split: ...}), globs expanded, in order.

    Remote entries stay URLs; a remote glob is expanded by listing the store (s3, gs, az)."""
    if isinstance(data_files, dict):
        if split not in data_files:
            raise ConfigError(
                f"data_files has splits {sorted(data_files)}, not {split!r}",
                field="data_files",
                hint=f"Pass split= one of {sorted(data_files)}",
            )
        data_files = data_files[split]
    if isinstance(data_files, str | os.PathLike):
        data_files = [data_files]
    files: list[str] = []
    for entry in data_files:
        pattern = os.fspath(entry)
        if is_remote_source(pattern):
            if any(ch in pattern for ch in "*?["):
                files.extend(expand_remote(pattern, access or RemoteOptions()))
            else:
                files.append(pattern)
            continue
        if any(ch in pattern for ch in "*?["):
            matched = sorted(glob.glob(pattern, recursive=True))
            if not matched:
                raise MissingFileError(f"the pattern {pattern!r} matches no file", path=pattern, field="data_files")
            files.extend(matched)
        else:
            if not Path(pattern).is_file():
                raise MissingFileError("data file not found (or not a regular file)", path=pattern, field="data_files")
            files.append(pattern)
    if not files:
        raise ConfigError("data_files lists no file: the dataset is empty", field="data_files")
    return files


def file_sources(files: list[str], access: RemoteOptions | None = None) -> list[Source]:
    """Each file's kind (by its content), size and row groups; a remote object's size and ETag from one HEAD."""
    sources = []
    for path in files:
        remote = stat_remote(path, access or RemoteOptions()) if is_remote_source(path) else None
        reader = _reader_of(path, remote, access or RemoteOptions())
        source = Source(
            kind=reader.name,
            path=path,
            size=remote.size if remote is not None else os.path.getsize(path),
            remote=remote,
            access=(access or RemoteOptions()) if remote is not None else None,
        )
        if reader.rows:
            try:
                row_groups = tuple(open_rows(source).units)
            except Exception as exc:
                if isinstance(exc, DataError):
                    raise
                raise FormatError(f"not a readable {reader.name} file: {exc}", path=path) from None
            source = Source(source.kind, path, source.size, row_groups, source.remote, source.access)
        sources.append(source)
    return sources


def _parts(source: Source, layout: Layout) -> int:
    """How many units ``layout`` cuts ``source`` into (before the stride)."""
    if source.cut is Cut.BYTES:
        return max(1, min(max(1, math.ceil(source.size / layout.unit_bytes)) * layout.split, source.size))
    return len(source.row_groups) if source.rows else 1


def unit_count(sources: list[Source], layout: Layout) -> int:
    """``len(enumerate_units(sources, layout))``, counted without building the list."""
    return sum(_parts(source, layout) for source in sources) * layout.stride


def _natural_units(sources: list[Source], layout: Layout) -> list[Unit]:
    units: list[Unit] = []
    for index, source in enumerate(sources):
        parts = _parts(source, layout)
        if source.cut is Cut.BYTES:
            units.extend(Unit(index, source.size * i // parts, source.size * (i + 1) // parts) for i in range(parts))
        else:
            units.extend(Unit(index, group if source.rows else 0, -1) for group in range(parts))
    return units


def enumerate_units(sources: list[Source], layout: Layout) -> list[Unit]:
    """The unit list: a pure function of (sources, layout)."""
    natural = _natural_units(sources, layout)
    if layout.stride == 1:
        return natural
    return [
        Unit(u.source, u.begin, u.end, stride=layout.stride, phase=phase)
        for u in natural
        for phase in range(layout.stride)
    ]


def choose_layout(sources: list[Source], slots: int, unit_bytes: int = DEFAULT_UNIT_BYTES) -> Layout:
    """At least ``slots`` units where possible: byte ranges of plain jsonl first, else stride by example."""
    layout = Layout(unit_bytes=unit_bytes)
    count = unit_count(sources, layout)
    if count >= slots or count == 0:
        return layout
    if any(s.cut is Cut.BYTES for s in sources):
        layout = Layout(unit_bytes=unit_bytes, split=math.ceil(slots / count))
        count = unit_count(sources, layout)
        if count >= slots:
            return layout
    stride = math.ceil(slots / count)
    log.warning(
        "only %d source shards for %d rank x worker slots and none can be split further: every shard is read "
        "by %d slots, each keeping every %d-th example (more files or row groups avoid the extra reading)",
        count,
        slots,
        stride,
        stride,
    )
    return Layout(unit_bytes=unit_bytes, split=layout.split, stride=stride)


def unit_sizes(units: list[Unit], sources: list[Source]) -> list[int]:
    """Approximate bytes of each unit, for balancing slots (HF shards: 1 each)."""
    sizes = []
    for unit in units:
        source = sources[unit.source]
        if source.cut is Cut.BYTES:
            size = unit.end - unit.begin
        elif source.rows:
            size = source.size * source.row_groups[unit.begin] // (sum(source.row_groups) or 1)
        else:
            size = source.size  # an HF shard's is 0: it weighs 1
        sizes.append(max(1, size // unit.stride))
    return sizes


def open_rows(source: Source) -> Any:
    """The source's RowFile: local, or over ranged reads with the reader's own remote open options (what an
    open leaves ``reusable``, parquet's footer, is kept per process by URL and ETag and handed back)."""
    reader = source.reader
    if source.remote is None:
        return reader.open(source.path)
    key = (source.remote.url, source.remote.etag, reader.name)  # one reader's footer is not another's
    handle = RangeReader(source.remote, source.access or RemoteOptions())
    rows = reader.open_remote(handle, shown=source.path, reuse=_REUSE.get(key))
    reusable = getattr(rows, "reusable", None)
    if reusable is not None and key not in _REUSE:
        if len(_REUSE) >= 256:
            _REUSE.pop(next(iter(_REUSE)))
        _REUSE[key] = reusable
    return rows


_REUSE: dict[tuple[str, str, str], Any] = {}
