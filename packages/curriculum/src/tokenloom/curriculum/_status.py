"""The run status file: atomic JSON in the run directory; ``halted`` is terminal.

Why terminal: an auto-resume script that restarts whatever stopped would loop on
a halt (the same position halts again). A writer therefore never replaces
``halted`` with ``stopped``/``running``/``completed`` unless told that the policy
was changed on purpose (``after_halt=True``).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from tokenloom.curriculum._errors import BucketExhausted
from tokenloom.formats import ConfigError, FormatError
from tokenloom.formats.io import atomic_write_bytes

__all__ = ["STATUS_FILE", "RunStatus", "read_run_status", "record_halt", "write_run_status"]

STATUS_FILE = "run_status.json"
RunStatus = str
STATUSES = ("running", "completed", "stopped", "halted", "error")


def read_run_status(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The status dict, or None when the run directory has none yet."""
    path = Path(run_dir) / STATUS_FILE
    if not path.is_file():
        return None
    try:
        status = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise FormatError(f"run status is not JSON: {exc}", path=path, hint="Delete it to start afresh") from None
    if not isinstance(status, dict) or status.get("status") not in STATUSES:
        raise FormatError(f"run status {status!r} has no valid 'status'", path=path, field="status")
    return status


def write_run_status(
    run_dir: str | os.PathLike[str], status: str, *, after_halt: bool = False, **fields: Any
) -> dict[str, Any]:
    """Write ``status`` (with ``fields``) atomically; returns what is on disk afterwards.

    A ``halted`` run stays halted (the call returns the halted record unchanged) unless
    ``after_halt`` says the run was resumed with a changed exhaustion policy.
    """
    if status not in STATUSES:
        raise ConfigError(f"status {status!r}, expected one of {list(STATUSES)}", field="status")
    directory = Path(run_dir)
    current = read_run_status(directory)
    if current is not None and current["status"] == "halted" and status != "halted" and not after_halt:
        return current
    record = {"status": status, "updated_at": datetime.now(UTC).isoformat(timespec="seconds"), **fields}
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(directory / STATUS_FILE, orjson.dumps(record, option=orjson.OPT_INDENT_2))
    return record


def record_halt(run_dir: str | os.PathLike[str], error: BucketExhausted, *, step: int | None = None) -> dict[str, Any]:
    """For a training loop's ``except BucketExhausted``: write the terminal ``halted`` status."""
    return write_run_status(
        run_dir,
        "halted",
        bucket=error.bucket,
        phase=error.phase,
        position=error.position,
        step=step if step is not None else error.step,
        message=str(error),
    )
