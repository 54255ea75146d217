"""The curriculum's named errors (all DataError, so callers can catch one type)."""

from __future__ import annotations

import json
from typing import Any

from tokenloom.formats import DataError

__all__ = ["BucketExhausted", "BucketMismatchError", "EmptyBucketError", "MissingValTwinError"]


class BucketExhausted(DataError):
    """The schedule reached the position where a bucket runs dry and the policy says halt.

    Raised at the same global position on every rank (the position is part of the
    plan), so no collective is needed. The attributes say where: ``bucket``,
    ``phase``, ``position`` (global sample) and ``step`` (when the global batch size
    is known).

    Crossing processes: pickling keeps every attribute (``__reduce__``). A DataLoader
    worker's exception reaches the main process only as torch's text ("Caught
    BucketExhausted in DataLoader worker process N. Original Traceback ..."), which
    torch passes to the one-string constructor; the worker therefore attaches the
    fields as a JSON note (:meth:`for_worker`), and the constructor rebuilds the
    original error from it: the same message (hint once) and the same attributes.
    """

    default_hint = (
        "`tokenloom curriculum plan CONFIG` shows every drain; to go on, set allow_bucket_exhaustion: true "
        "(renormalise) or bucket_exhaustion: repeat with max_repetition, and resume from the last checkpoint"
    )

    def __init__(
        self,
        problem: str,
        *,
        bucket: str | None = None,
        phase: int | None = None,
        position: int | None = None,
        step: int | None = None,
        **where: Any,
    ) -> None:
        if bucket is None and not where:
            fields = _worker_fields(problem)
            if fields is not None:  # re-raised by torch from a DataLoader worker
                problem = fields.pop("problem")
                bucket, phase, position, step = (fields.pop(k) for k in ("bucket", "phase", "position", "step"))
                where = fields
        self.bucket = bucket
        self.phase = phase
        self.position = position
        self.step = step
        super().__init__(problem, **where)

    def _fields(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in _FIELD_TYPES}

    def for_worker(self) -> BucketExhausted:
        """This error with its fields attached as a one-line JSON note (what survives torch's worker re-raise)."""
        self.add_note(_NOTE + json.dumps(self._fields(), separators=(",", ":")))
        return self

    def __reduce__(self):  # pyright: ignore[reportIncompatibleMethodOverride] - carries the halt fields too
        return (_rebuild_exhausted, (self._fields(),))


_NOTE = "tokenloom.curriculum.BucketExhausted fields: "
_FIELD_TYPES = {
    "problem": str,
    "bucket": str,
    "phase": int,
    "position": int,
    "step": int,
    "path": str,
    "offset": int,
    "record": int,
    "field": str,
    "hint": str,
}


def _rebuild_exhausted(fields: dict[str, Any]) -> BucketExhausted:
    fields = dict(fields)
    return BucketExhausted(fields.pop("problem"), **fields)


def _worker_fields(text: str) -> dict[str, Any] | None:
    """The fields a worker attached (see :meth:`BucketExhausted.for_worker`), or None."""
    at = text.rfind(_NOTE)
    if at < 0:
        return None
    line = text[at + len(_NOTE) :].split("\n", 1)[0]
    try:
        fields = json.loads(line)
    except ValueError:
        return None
    if not isinstance(fields, dict) or set(fields) != set(_FIELD_TYPES):
        return None
    for key, kind in _FIELD_TYPES.items():
        value = fields[key]
        if key != "problem" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, kind):
            return None
    return fields


class EmptyBucketError(DataError):
    """A bucket directory without token data."""


class MissingValTwinError(DataError):
    """A train bucket without its ``val/<bucket>`` twin (GPT-Simple's layout requires both)."""


class BucketMismatchError(DataError):
    """Shards or buckets that must agree (dtype, EOS id) do not."""
