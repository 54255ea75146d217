"""Slot states, their merge across ranks, and one crash-safe JSON file per rank.

A *slot state* (one per rank x worker, plain JSON, versioned) is what
``state_dict()`` returns inside a worker; StatefulDataLoader keeps it with the
batch it produced. :func:`merge_rank_states` takes every rank's saved loader
state, checks that the slots cover the saved topology exactly once with one
fingerprint, and returns one *merged state* to load into a new dataset on any
topology.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from tokenloom.formats import ConfigError, FormatError, MissingFileError, ResumeMismatchError
from tokenloom.formats.io import atomic_write_bytes

__all__ = [
    "FORMAT",
    "VERSION",
    "check_fingerprint",
    "load_rank_states",
    "merge_rank_states",
    "save_rank_state",
    "slot_states_in",
]

FORMAT = "tokenloom.hf_streaming"
VERSION = 1


def check_fingerprint(saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """ResumeMismatchError listing every field whose value differs."""
    fields = sorted(set(saved) | set(current))
    differing = [
        f"{f}: saved {saved.get(f)!r}, now {current.get(f)!r}" for f in fields if saved.get(f) != current.get(f)
    ]
    if differing:
        raise ResumeMismatchError(
            "the state belongs to other data, tokenizer or settings: " + "; ".join(differing),
            field="fingerprint",
            hint="Resume with the same data files, tokenizer, seq_len, seed, shuffle_buffer_size and mode, "
            "or start afresh",
        )


def _check_format(state: Mapping[str, Any]) -> None:
    if state.get("format") != FORMAT:
        raise ResumeMismatchError(f"not a {FORMAT} state (format {state.get('format')!r})", field="format")
    if state.get("version") != VERSION:
        raise ResumeMismatchError(
            f"state version {state.get('version')!r}, this tokenloom reads version {VERSION}",
            field="version",
            hint="Resume with the tokenloom release that wrote the state",
        )


def slot_states_in(loader_state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The slot states inside one StatefulDataLoader state (or a slot state itself)."""
    if loader_state.get("format") == FORMAT:
        return [dict(loader_state)]
    steps = loader_state.get("_steps_since_snapshot", 0)
    if steps:
        raise ConfigError(
            f"the loader state is {steps} steps past its last snapshot, so the stream position at the last "
            "yielded batch is unknown",
            field="snapshot_every_n_steps",
            hint="Build the StatefulDataLoader with snapshot_every_n_steps=1 (its default)",
        )
    found: list[dict[str, Any]] = []

    def walk(node: object) -> None:
        if isinstance(node, Mapping):
            if node.get("format") == FORMAT and node.get("kind") == "slot":
                found.append(dict(node))
                return
            for value in node.values():
                walk(value)
        elif isinstance(node, list | tuple):
            for value in node:
                walk(value)

    walk(loader_state)
    return found


def merge_rank_states(states: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Every rank's saved loader state -> one merged state for ``dataset.load_state_dict``.

    Checks: one format version, fingerprint, mode, topology and base across all
    slots, and every slot of the saved topology present exactly once.
    """
    slots: list[dict[str, Any]] = []
    for state in states:
        if not isinstance(state, Mapping):
            raise ConfigError(f"a rank state is a {type(state).__name__}, expected a dict", field="states")
        slots.extend(slot_states_in(state))
    if not slots:
        raise ResumeMismatchError(
            "no StreamingHuggingFaceDataset state among the given states",
            field="states",
            hint="Pass every rank's StatefulDataLoader.state_dict() (or load_rank_states(directory))",
        )
    first = slots[0]
    for slot in slots:
        _check_format(slot)
        check_fingerprint(slot["fingerprint"], first["fingerprint"])
        for key in ("mode", "world_size", "num_workers", "base", "layout"):
            if slot.get(key) != first.get(key):
                raise ResumeMismatchError(
                    f"slot states disagree on {key}: {slot.get(key)!r} vs {first.get(key)!r}",
                    field=key,
                    hint="Pass the states of one save: every rank's state from the same step",
                )
    world_size, num_workers = int(first["world_size"]), max(1, int(first["num_workers"]))
    expected = {(r, w) for r in range(world_size) for w in range(num_workers)}
    seen: dict[tuple[int, int], dict[str, Any]] = {}
    for slot in slots:
        key = (int(slot["rank"]), int(slot["worker"]))
        if key in seen and seen[key] != slot:
            raise ResumeMismatchError(
                f"two different states for rank {key[0]} worker {key[1]}",
                field="states",
                hint="Pass each rank's state once, all from the same step",
            )
        seen[key] = slot
    if set(seen) != expected:
        missing = sorted(expected - set(seen))
        extra = sorted(set(seen) - expected)
        raise ResumeMismatchError(
            f"the slot states do not cover the saved topology of {world_size} ranks x {num_workers} workers: "
            f"missing (rank, worker) {missing[:10]}{'...' if len(missing) > 10 else ''}, unexpected {extra[:10]}",
            field="states",
            hint="Pass the saved state of every rank (load_rank_states(directory) reads them all)",
        )
    return {
        "format": FORMAT,
        "version": VERSION,
        "kind": "merged",
        "mode": first["mode"],
        "fingerprint": first["fingerprint"],
        "world_size": world_size,
        "num_workers": int(first["num_workers"]),
        "layout": first["layout"],
        "base": first["base"],
        "slots": [seen[key] for key in sorted(seen)],
    }


def _rank_file(directory: Path, rank: int) -> Path:
    return directory / f"hf_stream_rank{rank:05d}.json"


def save_rank_state(directory: str | os.PathLike[str], rank: int, loader_state: Mapping[str, Any]) -> Path:
    """Write one rank's loader state as JSON, crash-safely (tmp, fsync, rename)."""
    path = _rank_file(Path(directory), rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        blob = orjson.dumps(loader_state, option=orjson.OPT_NON_STR_KEYS)
    except TypeError as exc:
        raise ConfigError(f"the loader state is not plain JSON: {exc}", field="loader_state") from None
    atomic_write_bytes(path, blob)
    return path


def load_rank_states(directory: str | os.PathLike[str], world_size: int | None = None) -> list[dict[str, Any]]:
    """Every rank's state file in ``directory`` (all of ranks 0..world_size-1 when given)."""
    root = Path(directory)
    files = sorted(root.glob("hf_stream_rank*.json"))
    if world_size is not None:
        wanted = [_rank_file(root, r) for r in range(world_size)]
        missing = [p.name for p in wanted if not p.exists()]
        if missing:
            raise MissingFileError(
                f"rank state files missing: {missing}", path=root, hint="Every rank must save its state"
            )
        files = wanted
    if not files:
        raise MissingFileError("no hf_stream_rank*.json state here", path=root)
    states = []
    for path in files:
        try:
            states.append(orjson.loads(path.read_bytes()))
        except (OSError, orjson.JSONDecodeError) as exc:
            raise FormatError(
                f"unreadable state file: {exc}",
                path=path,
                hint="The file is damaged or not a state: restore it from the checkpoint, or resume an earlier one",
            ) from None
    return states


def as_list(value: Sequence[Any] | None) -> list[Any]:
    return list(value) if value is not None else []
