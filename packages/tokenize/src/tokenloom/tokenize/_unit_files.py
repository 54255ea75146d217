"""The files of a unit-planned output: the plan, unit shards and per-unit done markers.

    OUT/.tokenloom-plan.json            the plan (run key + units: whole files or parts of them), created once,
                                        equal on every node
    OUT/unit_UUUUUU_KKKK.bin/.idx       shard K of unit U (the dataset's order is unit order)
    OUT/.tokenloom-unit-UUUUUU.done     unit U is committed: its shards, counts and encoder facts
    OUT/.tokenloom-nodes.json           how many nodes share the run (--num-nodes), the unit count and the plan
                                        hash, created once: a node started with another count is refused
    OUT/.tokenloom-node-RRRRRR.finished node R has committed its every unit (the last node knows it is last)
    (the last two are removed once the manifest is written: the dataset does not depend on the node count)

Both the plan and a done marker are created by an atomic create (a hard link of a
complete temp file, which fails if the name exists), so they are never overwritten
and never seen half-written, whichever node or Ray task gets there first.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import orjson
import xxhash

from tokenloom.formats import ConfigError, DataError, FormatError, ResumeMismatchError
from tokenloom.formats.io import fsync_dir, temp_base, temp_path
from tokenloom.tokenize._diff import run_key_differences
from tokenloom.tokenize._shards import ShardRecord
from tokenloom.tokenize.inputs import UnitSource

__all__ = [
    "NODES_NAME",
    "Counts",
    "Nodes",
    "PLAN_NAME",
    "UnitDone",
    "UnitFacts",
    "UnitPlan",
    "create_once",
    "done_path",
    "check_nodes",
    "establish_nodes",
    "establish_plan",
    "finished_nodes",
    "finished_path",
    "is_node_record",
    "mark_node_finished",
    "nodes_payload",
    "remove_node_records",
    "is_unit_file",
    "read_done",
    "remove_unit_temps",
    "uncommitted_error",
    "unit_stem",
]

#: = formats.keyed.records.RUN_PLAN_NAME (a test keeps them one; a text run need not import the keyed stores):
#: formats refuses a record store in a bucket that has it but no manifest yet
PLAN_NAME = ".tokenloom-plan.json"
NODES_NAME = ".tokenloom-nodes.json"
PLAN_VERSION = 1
_UNIT_FILE = re.compile(r"unit_(\d{6})_(\d{4})\.(bin|idx|records)|\.tokenloom-unit-(\d{6})\.done")
_FINISHED = re.compile(r"\.tokenloom-node-(\d{6})\.finished")


@dataclass(slots=True)
class Counts:
    """Running totals over the input read so far (a unit's, a node's or the run's)."""

    documents: int = 0
    input_bytes: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    """--windowing gpt-simple: documents its rule drops or cuts, by kind."""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"documents": self.documents, "input_bytes": self.input_bytes, "skipped": self.skipped}
        if self.dropped:
            data["dropped"] = dict(self.dropped)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Counts:
        return cls(data["documents"], data["input_bytes"], dict(data["skipped"]), dict(data.get("dropped", {})))

    def add(self, part: Counts) -> None:
        self.documents += part.documents
        self.input_bytes += part.input_bytes
        for mine, theirs in ((self.skipped, part.skipped), (self.dropped, part.dropped)):
            for kind, count in theirs.items():
                mine[kind] = mine.get(kind, 0) + count


def unit_stem(unit: int, part: int) -> str:
    return f"unit_{unit:06d}_{part:04d}"


def done_path(out: Path, unit: int) -> Path:
    return out / f".tokenloom-unit-{unit:06d}.done"


def _unit_of(name: str) -> int | None:
    match = _UNIT_FILE.fullmatch(temp_base(name))
    if match is None:
        return None
    return int(match[1] or match[4])


def is_unit_file(name: str) -> bool:
    """A file a unit-planned run writes (or a crashed writer's temp of one)."""
    base = temp_base(name)
    return base in (PLAN_NAME, NODES_NAME) or _FINISHED.fullmatch(base) is not None or _unit_of(name) is not None


def remove_unit_temps(out: Path, units: set[int]) -> None:
    """Remove temp files of ``units`` (killed writers); only units no live process writes may be passed."""
    for path in out.iterdir():
        if path.name.endswith(".tmp") and _unit_of(path.name) in units:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def create_once(path: Path, data: bytes) -> bool:
    """Create ``path`` holding ``data`` atomically, never over an existing file; False if it existed."""
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
    return True


@dataclass(frozen=True, slots=True)
class UnitPlan:
    """The units of a run (whole input files or parts of them, in path order) and the run key they belong to."""

    run_key: dict[str, Any]
    units: tuple[UnitSource, ...]

    def payload(self) -> bytes:
        units = [{"index": i, **unit.to_json()} for i, unit in enumerate(self.units)]
        body = {"plan_version": PLAN_VERSION, "run_key": self.run_key, "units": units}
        return orjson.dumps(body, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2)

    @property
    def digest(self) -> str:
        return xxhash.xxh3_128_hexdigest(self.payload())


def establish_plan(out: Path, plan: UnitPlan) -> None:
    """Write the plan if no node has yet; otherwise it must be this one (ResumeMismatchError naming what differs)."""
    path = out / PLAN_NAME
    wanted = plan.payload()
    if create_once(path, wanted):
        return
    recorded = path.read_bytes()
    if recorded == wanted:
        return
    try:
        recorded_key = orjson.loads(recorded)["run_key"]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise FormatError(
            f"the unit plan is unreadable ({exc})", path=path, hint="Start afresh into an empty --output-dir"
        ) from None
    differences = run_key_differences(recorded_key, plan.run_key)
    raise ResumeMismatchError(
        "the output directory's unit plan was made with other settings, tokenizer or inputs: " + "; ".join(differences),
        path=path,
        hint="Every node must run the same command on the same inputs: restore a changed input, or write into "
        "another --output-dir (or pass --overwrite on a single node) to start afresh",
    )


@dataclass(frozen=True, slots=True)
class UnitFacts:
    """What the encoder was (the same for every unit of a run); the manifest takes unit 0's."""

    dtype: str
    vocab_size: int
    eos_id: int
    engine: dict[str, Any]

    @classmethod
    def of(cls, encoding: Any) -> UnitFacts:
        """The facts of a started encoder (_executor.Encoding)."""
        return cls(encoding.dtype.name, encoding.info.vocab_size, encoding.eos_id, encoding.engine.record)

    def to_json(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "vocab_size": self.vocab_size, "eos_id": self.eos_id, "engine": self.engine}


@dataclass(frozen=True, slots=True)
class UnitDone:
    """A committed unit: its shards (in order), its counts and the encoder's facts."""

    unit: int
    plan: str
    shards: tuple[ShardRecord, ...]
    counts: Counts
    facts: UnitFacts

    def payload(self) -> bytes:
        body = {
            "unit": self.unit,
            "plan": self.plan,
            "shards": [s.to_json() for s in self.shards],
            "counts": self.counts.to_json(),
            "facts": self.facts.to_json(),
        }
        return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)


def read_done(out: Path, unit: int, plan_digest: str, sizes: Mapping[str, int] | None = None) -> UnitDone:
    """Unit ``unit``'s done marker, checked against the plan and its shard files' sizes.

    ``sizes`` (an object-store output): the sizes of the objects under the URL, checked instead of local files.
    """
    path = done_path(out, unit)
    try:
        data = orjson.loads(path.read_bytes())
        done = UnitDone(
            unit=int(data["unit"]),
            plan=str(data["plan"]),
            shards=tuple(ShardRecord.from_json(s) for s in data["shards"]),
            counts=Counts.from_json(data["counts"]),
            facts=UnitFacts(**data["facts"]),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise FormatError(
            f"the done marker of unit {unit} is unreadable ({exc})",
            path=path,
            hint="Delete it and rerun the node that owns the unit: the unit is encoded again",
        ) from None
    if done.plan != plan_digest or done.unit != unit:
        raise ResumeMismatchError(
            f"the done marker of unit {unit} belongs to another plan ({done.plan[:16]}..., expected "
            f"{plan_digest[:16]}...)",
            path=path,
            hint="Start afresh into an empty --output-dir",
        )
    for record in done.shards:
        for suffix, size in ((".bin", record.bin_bytes), (".idx", record.idx_bytes)):
            shard = out / f"{unit_stem(unit, record.index)}{suffix}"
            if sizes is not None:
                found: int | None = sizes.get(shard.name)
            else:
                found = shard.stat().st_size if shard.is_file() else None
            if found != size:
                raise ResumeMismatchError(
                    f"{shard.name} of committed unit {unit} is missing or has changed ({size} bytes recorded)",
                    path=shard,
                    hint=f"Delete {path.name} and rerun the node that owns unit {unit}",
                )
    return done


def uncommitted_error(
    plan: UnitPlan, missing: list[int], *, path: Any, recorded: int | None, everyone: bool, first: int, where: str = ""
) -> DataError:
    """Units not committed when the manifest is due (``where``: " at URL" for a bucket; ``everyone``: every node has
    finished, so they were taken by no node), with the nodes to rerun (units dealt from ``first`` on)."""
    shown = ", ".join(f"{u} ({plan.units[u].label})" for u in missing[:10]) + (" ..." if len(missing) > 10 else "")
    units = f"{len(missing)} of {len(plan.units)} units"
    why = (
        f"every node of --num-nodes {recorded} has finished, yet {units} were taken by no node{where}: {shown}"
        if everyone
        else f"{units} are not committed{where} yet: {shown}"
    )
    if recorded is not None and recorded > 1:
        ranks = ", ".join(str(r) for r in sorted({(first + u) % recorded for u in missing}))
        hint = f"Rerun --node-rank {ranks} of --num-nodes {recorded} (the nodes that own them), then --finalize"
    else:
        owner = (
            f"(u + {first}) % --num-nodes: a tree deals units across its leaves in order"
            if first
            else "u % --num-nodes"
        )
        hint = f"Rerun the nodes that own them (unit u belongs to --node-rank {owner}), then --finalize"
    return DataError(why, path=path, hint=hint)


class OnError(StrEnum):
    """What a bad input record does."""

    RAISE = "raise"
    """Stop with RecordError(file, line); publish nothing."""
    SKIP = "skip"
    """Count it by kind, report the counts at the end, and go on."""


@dataclass(frozen=True, kw_only=True, slots=True)
class UnitOptions:
    """How a unit's input is read and its shards written (``TokenizeConfig.unit_options``): all that a unit's
    reader and writer (_unit_work, a Ray task) take of the run, not the whole config."""

    on_error: OnError
    shard_size_tokens: int
    chunk_lines: int
    chunk_bytes: int
    max_line_bytes: int
    text_field: str


@dataclass(frozen=True, slots=True)
class Nodes:
    """--num-nodes / --node-rank as one value, read by the planner (_units, _tree) and the publisher (_publish)."""

    count: int | None = None
    """--num-nodes; None: one process (node 0 of 1), Ray tasks, or --finalize without it."""
    rank: int = 0
    recorded: int | None = 1
    """The node count this process records or checks; None when it deals no units of its own (--finalize
    without --num-nodes, or Ray, whose tasks take every unit still missing, whatever count began the run)."""

    @property
    def alone(self) -> bool:
        """A single process writes OUT (no --num-nodes, no Ray, no --finalize): it may hold the lock throughout."""
        return self.count is None and self.recorded == 1

    def units(self, total: int, first: int = 0) -> list[int]:
        """This node's units, dealt round-robin counted from ``first`` (a tree deals across all its leaves)."""
        return [u for u in range(total) if (first + u) % (self.count or 1) == self.rank]


def nodes_payload(plan: UnitPlan, num_nodes: int) -> bytes:
    body = {"num_nodes": num_nodes, "units": len(plan.units), "plan": plan.digest}
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)


def check_nodes(recorded: bytes, num_nodes: int | None, where: str) -> int:
    """The node count a run recorded (``where``: its file or URL); a ConfigError if this node was given another."""
    try:
        body = orjson.loads(recorded)
        theirs, units = int(body["num_nodes"]), int(body["units"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise FormatError(
            f"the record of the run's node count is unreadable ({exc})",
            path=where,
            hint="Delete it and rerun every node with the same --num-nodes",
        ) from None
    if num_nodes is not None and num_nodes != theirs:
        raise ConfigError(
            f"this node was started with --num-nodes {num_nodes}, but the run it joins was planned for --num-nodes "
            f"{theirs} ({units} units dealt as unit % {theirs}): with two counts some units would be taken by no "
            "node and others twice",
            path=where,
            field="num_nodes",
            hint=f"Start every node of this run with --num-nodes {theirs} (and its --node-rank below {theirs}), "
            "or write into another --output-dir to deal the units afresh",
        )
    return theirs


def establish_nodes(out: Path, plan: UnitPlan, num_nodes: int | None) -> int | None:
    """Record the node count once (the first node) or check it; the run's count (None: nothing recorded yet)."""
    path = out / NODES_NAME
    if num_nodes is not None and create_once(path, nodes_payload(plan, num_nodes)):
        return num_nodes
    try:
        recorded = path.read_bytes()
    except FileNotFoundError:
        return None
    return check_nodes(recorded, num_nodes, str(path))


def finished_path(out: Path, rank: int) -> Path:
    return out / f".tokenloom-node-{rank:06d}.finished"


def mark_node_finished(out: Path, rank: int) -> None:
    create_once(finished_path(out, rank), b"")


def finished_nodes(out: Path, num_nodes: int) -> int:
    """How many of the run's nodes have committed their every unit."""
    return sum(finished_path(out, rank).exists() for rank in range(num_nodes))


def is_node_record(name: str) -> bool:
    """The node count's record or a node's finished marker (removed with the manifest's arrival)."""
    return name == NODES_NAME or _FINISHED.fullmatch(name) is not None


def remove_node_records(out: Path) -> None:
    """Once the manifest is written: the dataset does not depend on how many nodes wrote it."""
    for path in out.iterdir():
        if is_node_record(path.name):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
