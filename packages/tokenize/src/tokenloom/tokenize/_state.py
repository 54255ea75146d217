"""The resume journal of an unfinished tokenize run.

After each shard is published, ``.tokenloom-tokenize-state.json`` is rewritten
atomically with everything a rerun needs: the run's key (settings, tokenizer
fingerprint, inputs), the published shards, where in the input the next shard
starts (chunk number and how many of that chunk's entries are already written)
and the counts of the chunks before that point. The manifest replaces it when
the run completes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tokenloom.formats import FormatError
from tokenloom.formats.io import atomic_write_bytes
from tokenloom.tokenize._shards import ShardRecord

__all__ = ["STATE_NAME", "Counts", "RunState", "read_state", "write_state"]

STATE_NAME = ".tokenloom-tokenize-state.json"
STATE_VERSION = 1


@dataclass(slots=True)
class Counts:
    """Running totals over the input read so far."""

    documents: int = 0
    input_bytes: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    """--windowing gpt-simple: documents its rule drops or cuts, by kind."""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "documents": self.documents,
            "input_bytes": self.input_bytes,
            "skipped": dict(self.skipped),
        }
        if self.dropped:
            data["dropped"] = dict(self.dropped)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Counts:
        return cls(data["documents"], data["input_bytes"], dict(data["skipped"]), dict(data.get("dropped", {})))

    def copy(self) -> Counts:
        return Counts(self.documents, self.input_bytes, dict(self.skipped), dict(self.dropped))


@dataclass(slots=True)
class RunState:
    run_key: dict[str, Any]
    shards: list[ShardRecord] = field(default_factory=list)
    next_chunk: int = 0
    skip_entries: int = 0
    counts: Counts = field(default_factory=Counts)
    file_index: int = 0
    """The input file holding ``next_chunk``; earlier files are not read again on resume."""
    file_first_chunk: int = 0
    """The number of that file's first chunk."""

    def to_json(self) -> dict[str, Any]:
        return {
            "state_version": STATE_VERSION,
            "run_key": self.run_key,
            "shards": [s.to_json() for s in self.shards],
            "next_chunk": self.next_chunk,
            "skip_entries": self.skip_entries,
            "counts": self.counts.to_json(),
            "file_index": self.file_index,
            "file_first_chunk": self.file_first_chunk,
        }


def write_state(directory: Path, state: RunState) -> None:
    atomic_write_bytes(directory / STATE_NAME, orjson.dumps(state.to_json(), option=orjson.OPT_SORT_KEYS))


def read_state(directory: Path) -> RunState | None:
    """The journal of an unfinished run in ``directory``, or None if there is none."""
    path = directory / STATE_NAME
    if not path.is_file():
        return None
    try:
        data = orjson.loads(path.read_bytes())
        if data.get("state_version") != STATE_VERSION:
            raise ValueError(f"state_version {data.get('state_version')!r}, expected {STATE_VERSION}")
        return RunState(
            run_key=data["run_key"],
            shards=[ShardRecord.from_json(s) for s in data["shards"]],
            next_chunk=int(data["next_chunk"]),
            skip_entries=int(data["skip_entries"]),
            counts=Counts.from_json(data["counts"]),
            file_index=int(data["file_index"]),
            file_first_chunk=int(data["file_first_chunk"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FormatError(
            f"the resume journal is unreadable ({exc})",
            path=path,
            hint="Pass --overwrite to start the run afresh",
        ) from exc
