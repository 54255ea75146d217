"""The record transform seam of the unit-planned pipeline: what a unit's input records become.

    a unit's source (a whole input file, a byte range, some row groups)
        -> unit_records: (record, place) in input order, through the input readers tokenize has
           (jsonl plain/.gz/.zst via the line reader; parquet and Arrow rows as objects)
        -> a RecordTransform: record -> the arrays the unit writer writes (None: skipped, counted)

text -> document is the transform of text runs (the workers' encode of ``--text-field``, written as
token shards by ``UnitWriter``); ``ChatTransform`` is post-training's: a conversation -> an sft record,
a preference pair -> a dpo record, a reward group -> a grpo record (:mod:`tokenloom.tokenize.chat`),
written to a record store per unit and merged in plan order (:mod:`._unit_records`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any, Protocol

import orjson

from tokenloom.formats import DataError, FormatError, RecordError
from tokenloom.tokenize._config import OnError, TokenizeConfig
from tokenloom.tokenize._fetch import local_path, named_by_url
from tokenloom.tokenize._inputs import _read_lines
from tokenloom.tokenize._sniff import InputKind, require_corpus_extra, sniff
from tokenloom.tokenize._unit_parts import ByteRange, RowGroups, UnitSource
from tokenloom.tokenize._unit_work import unit_line
from tokenloom.tokenize.chat import ChatEncoder, RecordPlace

__all__ = ["ChatTransform", "RecordTransform", "in_file", "transform_for", "unit_records"]


class RecordTransform(Protocol):
    """Turns one input record into what the unit writer writes; counts what it skips."""

    def apply(self, record: Any, place: RecordPlace) -> dict[str, Any] | None:
        """The arrays of ``record`` (read at ``place``), or None when it is skipped (counted in ``counts``)."""
        ...

    def counts(self) -> dict[str, Any]:
        """What this transform did so far (records, tokens, skips by reason), JSON-ready."""
        ...

    def skip_input(self, kind: str) -> None:
        """Count a record the reader could not give (``kind``: malformed_json, line_too_long, ...)."""
        ...


class ChatTransform:
    """Post-training: a record -> sft / dpo / grpo arrays with proven loss masks (ChatEncoder)."""

    def __init__(self, config: TokenizeConfig, tokenizer: str) -> None:
        self.encoder = ChatEncoder(
            tokenizer,
            chat_template=config.chat_template,
            train_type=config.train_type or "sft",
            train_roles=config.train_roles,
            max_length=config.max_length,
            truncate=config.truncate,
            on_error=config.on_error.value,
        )
        self.input_skips: Counter[str] = Counter()

    def apply(self, record: Any, place: RecordPlace) -> dict[str, Any] | None:
        return self.encoder.encode(record, place)

    def skip_input(self, kind: str) -> None:
        self.input_skips[kind] += 1

    def counts(self) -> dict[str, Any]:
        stats = self.encoder.stats.as_dict()
        errors = Counter(stats["errors"]) + self.input_skips
        stats["errors"] = dict(sorted(errors.items()))
        stats["skipped_errors"] += sum(self.input_skips.values())
        return stats

    def reset(self) -> None:
        """Zero the counts (one encoder serves many units of a worker)."""
        self.encoder.stats = type(self.encoder.stats)()
        self.input_skips = Counter()


_TRANSFORMS: dict[tuple[Any, ...], ChatTransform] = {}


def transform_for(config: TokenizeConfig, tokenizer: str) -> ChatTransform:
    """This process's transform for ``config`` (built once per process: loading a tokenizer costs a second)."""
    key = (tokenizer, orjson.dumps(config.record_settings(), option=orjson.OPT_SORT_KEYS), config.chat_template)
    transform = _TRANSFORMS.get(key)
    if transform is None:
        transform = _TRANSFORMS[key] = ChatTransform(config, tokenizer)
    transform.reset()
    return transform


def unit_records(
    source: UnitSource, config: TokenizeConfig, transform: RecordTransform
) -> Iterator[tuple[Any, RecordPlace]]:
    """The records of one unit in input order, each with its file and line (or row); bad lines are raised
    (RecordError naming file and line) or counted by ``transform.skip_input``, as ``--on-error`` says.

    A byte-range unit numbers its lines from 1 at its start (counting the lines before it would read the
    file's prefix for every unit); :func:`in_file` turns an error's line into the file's.
    """
    info = source.file
    path = local_path(info)
    with named_by_url(info):
        kind = info.kind or sniff(path)
    if kind.columnar:
        yield from _rows(source, kind)
        return
    part = source.part if isinstance(source.part, ByteRange) else None
    line = 0
    for lines, _sizes, issue in _read_lines(path, kind, config.max_line_bytes, [], part):
        if issue is not None:
            if issue.line == 0 and issue.kind.value == "empty_file":
                continue  # an empty input holds no records: nothing to count
            where = issue.line or None
            _bad(config, transform, info.shown, where, issue.kind.value, issue.message)
            if issue.line:
                line = issue.line
            continue
        for raw in lines:
            line += 1
            place = RecordPlace(info.shown, line)
            try:
                record = orjson.loads(raw)  # type: ignore[arg-type]
            except orjson.JSONDecodeError as exc:
                _bad(config, transform, info.shown, line, "malformed_json", f"the line is not valid JSON ({exc})")
                continue
            yield record, place


def in_file(error: DataError, source: UnitSource) -> DataError:
    """``error`` with its line counted in the whole file, not from the start of a byte-range unit."""
    if error.record is None or unit_line(source, error.record) == error.record:
        return error
    line = unit_line(source, error.record)
    return type(error)(
        error.problem, path=error.path, offset=error.offset, record=line, field=error.field, hint=error.hint
    )


def _bad(
    config: TokenizeConfig, transform: RecordTransform, path: str, line: int | None, kind: str, message: str
) -> None:
    if config.on_error is OnError.RAISE:
        raise RecordError(
            message,
            path=path,
            record=line,
            field=kind,
            hint="Fix or remove the record, or pass --on-error skip to count and skip bad records",
        )
    transform.skip_input(kind)


def _rows(source: UnitSource, kind: InputKind) -> Iterator[tuple[Any, RecordPlace]]:
    """Parquet / Arrow rows as objects (a nested ``messages`` column becomes lists of dicts), numbered from 1.

    An unreadable file (a damaged footer, page or batch) is a FormatError naming it, whatever --on-error says.
    """
    pa = require_corpus_extra("pyarrow", kind)
    try:
        yield from _read_rows(source, kind, pa)
    except (OSError, pa.ArrowException) as exc:
        raise FormatError(
            f"this {kind} file cannot be read ({type(exc).__name__}: {' '.join(str(exc).split())})",
            path=source.file.shown,
            hint="The file is corrupt or cut short: copy or download it again (nothing was published)",
        ) from None


def _read_rows(source: UnitSource, kind: InputKind, pa: Any) -> Iterator[tuple[Any, RecordPlace]]:
    path = local_path(source.file)
    shown = source.file.shown
    if kind is InputKind.PARQUET:
        pq = require_corpus_extra("pyarrow.parquet", kind)
        parquet = pq.ParquetFile(path)
        groups = range(parquet.metadata.num_row_groups)
        if isinstance(source.part, RowGroups):
            groups = range(source.part.first, source.part.stop)
        row = sum(parquet.metadata.row_group(g).num_rows for g in range(groups.start))
        tables = (parquet.read_row_group(g) for g in groups)
    else:
        mapped = pa.memory_map(str(path))
        head = mapped.read(6)
        mapped.seek(0)
        reader = pa.ipc.open_file(mapped) if head == b"ARROW1" else pa.ipc.open_stream(mapped)
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)] if head == b"ARROW1" else reader
        row, tables = 0, iter(batches)
    for table in tables:
        for record in table.to_pylist():
            row += 1
            yield record, RecordPlace(shown, row)
