"""The curriculum's named errors (all DataError, so callers can catch one type)."""

from __future__ import annotations

import re
from typing import Any

from tokenloom.formats import DataError

__all__ = ["BucketExhausted", "BucketMismatchError", "EmptyBucketError", "MissingValTwinError"]


class BucketExhausted(DataError):
    """The schedule reached the position where a bucket runs dry and the policy says halt.

    Raised at the same global position on every rank (the position is part of the
    plan), so no collective is needed. The attributes say where: ``bucket``,
    ``phase``, ``position`` (global sample) and ``step`` (when the global batch size
    is known). A single-string constructor also works, so a DataLoader worker's
    exception is re-raised in the main process as a BucketExhausted.
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
        if bucket is None:  # re-raised from a DataLoader worker: only the message crossed over
            found = _WHERE.search(problem)
            if found:
                bucket, position, phase = found.group(1), int(found.group(2)), int(found.group(3))
                at_step = _STEP.search(problem)
                step = int(at_step.group(1)) if at_step else None
        self.bucket = bucket
        self.phase = phase
        self.position = position
        self.step = step
        super().__init__(problem, **where)


_WHERE = re.compile(r"bucket '([^']*)' runs dry at sample (\d+) \(phase (\d+)")
_STEP = re.compile(r"global step (\d+) at global batch")


class EmptyBucketError(DataError):
    """A bucket directory without token data."""


class MissingValTwinError(DataError):
    """A train bucket without its ``val/<bucket>`` twin (GPT-Simple's layout requires both)."""


class BucketMismatchError(DataError):
    """Shards or buckets that must agree (dtype, EOS id) do not."""
