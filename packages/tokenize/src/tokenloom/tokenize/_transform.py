"""The record transform seam of the unit-planned pipeline: what a unit's input records become, by the run's kind.

    a unit's source (a whole input file, a byte range, some row groups)
        -> its records, from the input room (:mod:`tokenloom.tokenize.inputs`)
        -> the run's transform (:func:`transform_for`, chosen by the kind of the run's options):
           text documents (EncodeSettings): ``TextTransform``, text -> document. It takes chunks of lines or rows
               (read_chunks), not single records: each chunk's ``--text-field`` texts are encoded in one batch by the
               run's workers or threads (_worker.encode_chunk), EOD appended, windowed; ``UnitWriter`` writes token
               shards (:mod:`._unit_work`)
           chat records (RecordOptions, ``--train-type``): ``ChatTransform``, a conversation -> an sft record, a
               preference pair -> a dpo record, a reward group -> a grpo record (:mod:`tokenloom.tokenize.chat`), one
               record at a time (unit_records: ``RecordTransform``), written to a record store per unit and merged in
               plan order (:mod:`._unit_records`)

A text run never imports the chat modules: ChatTransform loads them when it is built.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, overload

import orjson

from tokenloom.formats import DataError, RecordError
from tokenloom.tokenize._executor import Encoding, run_ordered
from tokenloom.tokenize._record_settings import RecordOptions
from tokenloom.tokenize._worker import ChunkResult, EncodeSettings
from tokenloom.tokenize.inputs import (
    ByteRange,
    Chunk,
    Issue,
    IssueKind,
    UnitSource,
    lines_before,
    local_path,
    read_records,
)

if TYPE_CHECKING:
    from tokenloom.tokenize.chat import AstraiEncoder, ChatEncoder, RecordPlace

__all__ = [
    "ChatTransform",
    "RecordTransform",
    "TextTransform",
    "in_file",
    "transform_for",
    "unit_line",
    "unit_records",
]


@dataclass(frozen=True, slots=True)
class TextTransform:
    """Text -> document: chunks of a unit's lines or rows -> their documents' tokens (EOD, windows), in input order."""

    settings: EncodeSettings
    encoding: Encoding | None = None
    """The run's started encoder (its worker processes or threads); None: encode on this thread (a unit task)."""

    def encode(self, chunks: Iterator[Chunk]) -> Iterator[ChunkResult]:
        """Every chunk encoded (bad records become its issues), at most the encoder's window in flight."""
        if self.encoding is None:
            return run_ordered(None, chunks, self.settings, 1)
        encoding = self.encoding
        return run_ordered(encoding.executor, chunks, self.settings, encoding.window, encoder=encoding.encoder)


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

    def __init__(self, options: RecordOptions, tokenizer: str) -> None:
        from tokenloom.tokenize.chat import AstraiEncoder, ChatEncoder  # a records run's modules, loaded by it only

        self.encoder: ChatEncoder | AstraiEncoder
        self.input_skips: Counter[str] = Counter()
        if options.astrai_config is not None:  # AstraiEncoder: AstrAI's per-message rendering, masks and cuts
            self.encoder = AstraiEncoder(
                options.astrai_config, tokenizer, chat_template=options.chat_template, on_error=options.on_error
            )
            return
        self.encoder = ChatEncoder(
            tokenizer,
            chat_template=options.chat_template,
            train_type=options.train_type or "sft",
            train_roles=options.train_roles,
            seq_len=options.seq_len,
            truncate=options.truncate,
            on_error=options.on_error,
        )

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
        self.encoder.stats = type(self.encoder.stats)()  # pyright: ignore[reportAttributeAccessIssue]
        self.input_skips = Counter()


_TRANSFORMS: dict[tuple[Any, ...], ChatTransform] = {}


@overload
def transform_for(options: EncodeSettings, tokenizer: str, encoding: Encoding | None = None) -> TextTransform: ...
@overload
def transform_for(options: RecordOptions, tokenizer: str, encoding: None = None) -> ChatTransform: ...
def transform_for(
    options: EncodeSettings | RecordOptions, tokenizer: str, encoding: Encoding | None = None
) -> TextTransform | ChatTransform:
    """The run's transform, by its kind: text documents (``options``: the encode settings, ``encoding``: the started
    encoder, None for this thread) or chat records (the record options; this process's ChatTransform, built once per
    process: loading a tokenizer costs a second)."""
    if isinstance(options, EncodeSettings):
        return TextTransform(options, encoding)
    key = (tokenizer, orjson.dumps(options.settings(), option=orjson.OPT_SORT_KEYS), options.chat_template)
    transform = _TRANSFORMS.get(key)
    if transform is None:
        transform = _TRANSFORMS[key] = ChatTransform(options, tokenizer)
    transform.reset()
    return transform


def unit_records(
    source: UnitSource, options: RecordOptions, transform: RecordTransform
) -> Iterator[tuple[Any, RecordPlace]]:
    """The records of one unit in input order, each with its file and line (or row); bad lines are raised
    (RecordError naming file and line) or counted by ``transform.skip_input``, as ``--on-error`` says.

    A byte-range unit numbers its lines from 1 at its start (counting the lines before it would read the
    file's prefix for every unit); :func:`in_file` turns an error's line into the file's.
    """
    from tokenloom.tokenize.chat import RecordPlace

    shown = source.file.shown
    for record in read_records(source, options.max_line_bytes):
        if isinstance(record, Issue) or record.issue is not None:
            issue = record if isinstance(record, Issue) else record.issue
            if issue is None or issue.kind is IssueKind.EMPTY_FILE:
                continue  # an empty input holds no records: nothing to count
            _bad(options, transform, shown, issue.line or None, issue.kind.value, issue.message)
            continue
        place = RecordPlace(shown, record.line)
        if not isinstance(record.value, bytes):  # a row of a parquet or Arrow file
            yield record.value, place
            continue
        try:
            value = orjson.loads(record.value)
        except orjson.JSONDecodeError as exc:
            _bad(options, transform, shown, record.line, "malformed_json", f"the line is not valid JSON ({exc})")
            continue
        yield value, place


def in_file(error: DataError, source: UnitSource) -> DataError:
    """``error`` with its line counted in the whole file, not from the start of a byte-range unit."""
    if error.record is None or unit_line(source, error.record) == error.record:
        return error
    line = unit_line(source, error.record)
    return type(error)(
        error.problem, path=error.path, offset=error.offset, record=line, field=error.field, hint=error.hint
    )


def unit_line(source: UnitSource, line: int) -> int:
    """A line number in the file: a byte-range unit numbers its lines from 1 at its start.

    The prefix is counted only for a bad record: the common path never reads it."""
    part = source.part
    if line <= 0 or not isinstance(part, ByteRange) or part.start == 0:
        return line
    return _lines_before(local_path(source.file), part.start) + line


@functools.lru_cache(maxsize=16)
def _lines_before(path: Path, start: int) -> int:
    return lines_before(path, start)


def _bad(
    options: RecordOptions, transform: RecordTransform, path: str, line: int | None, kind: str, message: str
) -> None:
    if options.on_error == "raise":
        raise RecordError(
            message,
            path=path,
            record=line,
            field=kind,
            hint="Fix or remove the record, or pass --on-error skip to count and skip bad records",
        )
    transform.skip_input(kind)
