"""The record transform seam of the unit-planned pipeline: what a unit's input records become.

    a unit's source (a whole input file, a byte range, some row groups)
        -> unit_records: (record, place) in input order, from the input room's records
           (:func:`tokenloom.tokenize.inputs.read_records`: lines parsed here, rows as objects)
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

from tokenloom.formats import DataError, RecordError
from tokenloom.tokenize._record_settings import RecordOptions
from tokenloom.tokenize._unit_work import unit_line
from tokenloom.tokenize.chat import AstraiEncoder, ChatEncoder, RecordPlace
from tokenloom.tokenize.inputs import Issue, IssueKind, UnitSource, read_records

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

    def __init__(self, options: RecordOptions, tokenizer: str) -> None:
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


def transform_for(options: RecordOptions, tokenizer: str) -> ChatTransform:
    """This process's transform for ``options`` (built once per process: loading a tokenizer costs a second)."""
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
