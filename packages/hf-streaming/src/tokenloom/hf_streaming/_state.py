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
import stat
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from tokenloom.formats import ConfigError, FormatError, MissingFileError, ResumeMismatchError, UnsafePathError
from tokenloom.formats.io import atomic_write_bytes

__all__ = [
    "FORMAT",
    "VERSION",
    "check_fingerprint",
    "check_slot_state",
    "check_state",
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
        raise ResumeMismatchError(
            f"not a {FORMAT} state (format {state.get('format')!r})",
            field="format",
            hint="Pass a state from state_dict() or merge_rank_states()",
        )
    if state.get("version") != VERSION:
        raise ResumeMismatchError(
            f"state version {state.get('version')!r}, this tokenloom reads version {VERSION}",
            field="version",
            hint="Resume with the tokenloom release that wrote the state",
        )


_SHARED = ("mode", "world_size", "num_workers", "layout", "base", "objects")
"""What every slot of one save has in common (``objects`` only where a source is remote), beside the fingerprint."""
FINGERPRINT_FIELDS = ("mode", "data", "tokenizer", "text_field", "seq_len", "seed", "block", "eos_id")
_MAX_LAYOUT_FACTOR = 1 << 20
_DAMAGED = (
    "The state is damaged or was not written by tokenloom: restore it from the checkpoint, or resume an earlier one"
)


def _bad(where: str, name: str, value: Any, expected: str) -> ResumeMismatchError:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return ResumeMismatchError(f"{where}: {name} is {shown}, expected {expected}", field=name, hint=_DAMAGED)


def _field(state: Mapping[str, Any], name: str, where: str) -> Any:
    if name not in state:
        raise ResumeMismatchError(f"{where}: the field {name!r} is missing", field=name, hint=_DAMAGED)
    return state[name]


def _int(value: Any, name: str, where: str, *, low: int = 0, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        span = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise _bad(where, name, value, f"an integer {span}")
    return value


def _ints(value: Any, count: int, name: str, where: str, lows: Sequence[int]) -> list[int]:
    if not isinstance(value, list | tuple) or len(value) != count:
        raise _bad(where, name, value, f"a list of {count} integers")
    return [_int(v, name, where, low=low) for v, low in zip(value, lows, strict=True)]


def _check_layout(layout: Any, where: str) -> None:
    if layout is None:
        return
    if not isinstance(layout, Mapping):
        raise _bad(where, "layout", layout, "an object {unit_bytes, split, stride} or null")
    _int(_field(layout, "unit_bytes", where), "layout.unit_bytes", where, low=1)
    for name in ("split", "stride"):
        _int(_field(layout, name, where), f"layout.{name}", where, low=1, high=_MAX_LAYOUT_FACTOR)


def _check_base(base: Any, where: str) -> None:
    if base is None:
        return
    if not isinstance(base, Mapping):
        raise _bad(where, "base", base, "an object {start, epochs} or null")
    start = _int(_field(base, "start", where), "base.start", where)
    epochs = _field(base, "epochs", where)
    if not isinstance(epochs, list):
        raise _bad(where, "base.epochs", epochs, "a list")
    for entry in epochs:
        if not isinstance(entry, Mapping):
            raise _bad(where, "base.epochs", entry, "objects {epoch, done, partial}")
        _int(_field(entry, "epoch", where), "base.epochs.epoch", where, low=start)
        done = _field(entry, "done", where)
        if not isinstance(done, list):
            raise _bad(where, "base.epochs.done", done, "a list of [begin, end) unit ranges")
        for pair in done:
            begin, end = _ints(pair, 2, "base.epochs.done", where, (0, 0))
            if end <= begin:
                raise _bad(where, "base.epochs.done", pair, "a [begin, end) range with begin < end")
        partial = _field(entry, "partial", where)
        if not isinstance(partial, list):
            raise _bad(where, "base.epochs.partial", partial, "a list of [unit, row, token, hint]")
        for item in partial:
            _ints(item, 4, "base.epochs.partial", where, (0, 0, 0, -1))


def _check_common(state: Mapping[str, Any], where: str) -> None:
    mode = _field(state, "mode", where)
    if mode not in ("exact", "compat"):
        raise _bad(where, "mode", mode, "'exact' or 'compat'")
    fingerprint = _field(state, "fingerprint", where)
    if not isinstance(fingerprint, Mapping):
        raise _bad(where, "fingerprint", fingerprint, f"an object with {list(FINGERPRINT_FIELDS)}")
    missing = [f for f in FINGERPRINT_FIELDS if f not in fingerprint]
    if missing:
        raise ResumeMismatchError(f"{where}: the fingerprint lacks {missing}", field="fingerprint", hint=_DAMAGED)
    if fingerprint["mode"] != mode:
        raise _bad(where, "fingerprint.mode", fingerprint["mode"], f"the state's mode {mode!r}")
    _int(_field(state, "world_size", where), "world_size", where, low=1)
    _int(_field(state, "num_workers", where), "num_workers", where)
    _check_layout(_field(state, "layout", where), where)
    _check_base(_field(state, "base", where), where)


def check_slot_state(state: Any, where: str = "the state") -> None:
    """A ResumeMismatchError naming the field if ``state`` is not a well-formed slot state."""
    if not isinstance(state, Mapping):
        raise _bad(where, "state", state, "an object")
    _check_format(state)
    _check_common(state, where)
    kind = _field(state, "kind", where)
    if kind != "slot":
        raise _bad(where, "kind", kind, "'slot'")
    world_size, num_workers = state["world_size"], max(1, state["num_workers"])
    _int(_field(state, "rank", where), "rank", where, high=world_size - 1)
    _int(_field(state, "worker", where), "worker", where, high=num_workers - 1)
    _int(_field(state, "epoch", where), "epoch", where)
    _int(_field(state, "item", where), "item", where)
    current = _field(state, "current", where)
    if current is not None:
        _ints(current, 3, "current", where, (0, 0, -1))
    for name in ("samples", "skipped"):
        _int(state.get(name, 0), name, where)


def check_state(state: Any, where: str = "the state") -> None:
    """A ResumeMismatchError naming the field if ``state`` is not a well-formed slot or merged state."""
    if isinstance(state, Mapping) and state.get("kind") == "merged":
        _check_format(state)
        _check_common(state, where)
        slots = _field(state, "slots", where)
        if not isinstance(slots, list) or not slots:
            raise _bad(where, "slots", slots, "a non-empty list of slot states")
        for slot in slots:
            check_slot_state(slot, where)
        _check_agree(
            slots, state, f"{where}: a slot's {{key}} {{slot!r}} differs from the merged state's {{ours!r}}", _DAMAGED
        )
        _check_cover(slots, state["world_size"], max(1, state["num_workers"]))
        return
    check_slot_state(state, where)


def _check_agree(slots: list[dict[str, Any]], reference: Mapping[str, Any], message: str, hint: str) -> None:
    """Every slot has ``reference``'s fingerprint, mode, topology, base, layout and objects (``message`` names
    the first that differs with ``{key}``, ``{slot}`` and ``{ours}``)."""
    for slot in slots:
        _check_format(slot)
        check_fingerprint(slot["fingerprint"], reference["fingerprint"])
        for key in _SHARED:
            if slot.get(key) != reference.get(key):
                shown = message.format(key=key, slot=slot.get(key), ours=reference.get(key))
                raise ResumeMismatchError(shown, field=key, hint=hint)


def _check_cover(slots: list[dict[str, Any]], world_size: int, num_workers: int) -> list[dict[str, Any]]:
    """The slots, one per (rank, worker) of the saved topology, in (rank, worker) order."""
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
    return [seen[key] for key in sorted(seen)]


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
    steps: list[tuple[list[int], int, bool]] = []  # (ranks, loader step, loader finished) per given state
    for index, state in enumerate(states):
        if not isinstance(state, Mapping):
            raise ConfigError(f"a rank state is a {type(state).__name__}, expected a dict", field="states")
        found = slot_states_in(state)
        for slot in found:
            check_slot_state(slot, f"rank state #{index}")
        slots.extend(found)
        step = _loader_step(state, f"rank state #{index}")
        if step is not None and found:
            steps.append((sorted({int(s["rank"]) for s in found}), step, state.get("_iterator_finished") is True))
    _check_same_step(steps)
    if not slots:
        raise ResumeMismatchError(
            "no StreamingHuggingFaceDataset state among the given states",
            field="states",
            hint="Pass every rank's StatefulDataLoader.state_dict() (or load_rank_states(directory))",
        )
    first = slots[0]
    _check_agree(
        slots,
        first,
        "slot states disagree on {key}: {slot!r} vs {ours!r}",
        "Pass the states of one save: every rank's state from the same step",
    )
    covered = _check_cover(slots, first["world_size"], max(1, first["num_workers"]))
    merged = {key: first[key] for key in ("format", "version", "fingerprint", *_SHARED) if key in first}
    return {**merged, "kind": "merged", "slots": covered}


def _loader_step(state: Mapping[str, Any], where: str) -> int | None:
    """The number of batches a StatefulDataLoader state was saved after (None for a bare slot state)."""
    snapshot = state.get("_snapshot")
    if isinstance(snapshot, Mapping) and "_snapshot_step" in snapshot:
        return _int(snapshot["_snapshot_step"], "_snapshot_step", where)
    if "_num_yielded" in state:
        return _int(state["_num_yielded"], "_num_yielded", where)
    return None


def _check_same_step(steps: list[tuple[list[int], int, bool]]) -> None:
    """Ranks saved at one step: every running loader at the same step, a finished one not beyond it."""
    running = {step for _, step, finished in steps if not finished}
    latest = max(running) if running else None
    if len(running) <= 1 and (latest is None or all(step <= latest for _, step, _ in steps)):
        return
    shown = ", ".join(
        f"rank {'/'.join(map(str, ranks))} at step {step}{' (finished)' if finished else ''}"
        for ranks, step, finished in sorted(steps)
    )
    raise ResumeMismatchError(
        f"the rank states were saved at different steps: {shown}",
        field="step",
        hint="Pass the states of one save: every rank's state from the same step",
    )


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


def _read_state(path: Path) -> Any:
    """A state file's JSON; a FIFO, device or directory is refused before any read can block.

    Opened with O_NONBLOCK (a FIFO with no writer would block open() forever) and checked with
    fstat on the opened descriptor, so a swap between the check and the read cannot slip through.
    """
    fd = -1
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "FIFO" if stat.S_ISFIFO(mode) else "directory" if stat.S_ISDIR(mode) else "special file"
            raise UnsafePathError(
                f"{path.name} is a {kind}, expected a regular state file",
                path=path,
                hint="Point at the directory save_rank_state wrote, with its hf_stream_rank*.json files",
            )
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as handle:
            fd = -1  # the file object owns it now
            return orjson.loads(handle.read())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise FormatError(f"unreadable state file: {exc}", path=path, hint=_DAMAGED) from None
    finally:
        if fd >= 0:
            os.close(fd)


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
    return [_read_state(path) for path in files]
