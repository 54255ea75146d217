"""The work of a unit: its writer (shards, then the done marker), and the units a node still owes.

Shared by the local pool (_units) and Ray tasks (_ray): a unit is written the same way by either.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from tokenloom.formats import RecordError
from tokenloom.tokenize._config import ExecutorKind, OnError, TokenizeConfig
from tokenloom.tokenize._shards import ShardCutter, ShardRecord
from tokenloom.tokenize._state import Counts
from tokenloom.tokenize._summary import EXAMPLES_PER_KIND
from tokenloom.tokenize._unit_files import (
    UnitDone,
    UnitFacts,
    UnitPlan,
    create_once,
    done_path,
    remove_unit_temps,
    unit_stem,
)
from tokenloom.tokenize._worker import ChunkResult
from tokenloom.tokenize.inputs import ByteRange, UnitSource, lines_before, local_path

__all__ = ["Session", "UnitWriter", "add_counts", "dealt_nodes", "pending_units"]

log = logging.getLogger("tokenloom.tokenize")


@dataclass(slots=True)
class Session:
    """What this process (or its Ray tasks) encoded."""

    units: int = 0
    tokens: int = 0
    bytes_read: int = 0
    text_bytes: int = 0
    counts: Counts = field(default_factory=Counts)
    examples: list[str] = field(default_factory=list)
    facts: UnitFacts | None = None


class UnitWriter:
    """Consumes one unit's chunk results in order into its shards; ``commit`` creates its done marker."""

    def __init__(self, config: TokenizeConfig, unit: int, source: UnitSource, facts: UnitFacts, plan: str) -> None:
        self.config = config
        self.unit = unit
        self.source = source
        self.facts = facts
        self.plan = plan
        self.counts = Counts()
        self.examples: list[str] = []
        self.records: list[ShardRecord] = []
        self._line_base: int | None = None
        self.cutter = ShardCutter(
            config.output_dir,
            dtype=np.dtype(facts.dtype),
            shard_size_tokens=config.shard_size_tokens,
            first_shard=0,
            on_shard=lambda record, _entries: self.records.append(record),
            stem=lambda part: unit_stem(unit, part),
        )

    def _line(self, line: int) -> int:
        """A line number in the file: a byte-range unit numbers its lines from 1 at its start."""
        part = self.source.part
        if line <= 0 or not isinstance(part, ByteRange) or part.start == 0:
            return line
        if self._line_base is None:  # counted only when a record is bad: the common path never reads the prefix
            self._line_base = lines_before(local_path(self.source.file), part.start)
        return self._line_base + line

    def consume(self, result: ChunkResult) -> None:
        path = self.source.file.shown
        for issue in result.issues:
            line = self._line(issue.line)
            if self.config.on_error is OnError.RAISE:
                raise RecordError(issue.message, path=path, record=line, field=issue.kind.value)
            kind = issue.kind.value
            self.counts.skipped[kind] = self.counts.skipped.get(kind, 0) + 1
            if self.counts.skipped[kind] <= EXAMPLES_PER_KIND:
                self.examples.append(f"{path}:{line}: {kind}: {issue.message}")
        self.cutter.feed(result.tokens, result.lengths, result.overlap_prefix)
        self.counts.documents += result.documents
        for kind, count in (result.dropped or {}).items():
            self.counts.dropped[kind] = self.counts.dropped.get(kind, 0) + count
        self.counts.input_bytes += result.num_bytes

    def commit(self) -> UnitDone:
        """Close the unit's last shard (an empty one if it has none), then create its done marker."""
        self.cutter.finish(0, ensure_one=not self.records)
        done = UnitDone(self.unit, self.plan, tuple(self.records), self.counts, self.facts)
        if not create_once(done_path(self.config.output_dir, self.unit), done.payload()):
            log.info("unit %d was already committed by another process (its bytes are the same)", self.unit)
        return done

    def abort(self) -> None:
        self.cutter.abort()


def node_units(config: TokenizeConfig, units: int, first: int = 0) -> list[int]:
    """The units this node takes: dealt round-robin, counted from ``first`` (a tree deals across all its leaves)."""
    num_nodes = config.num_nodes or 1
    return [u for u in range(units) if (first + u) % num_nodes == config.node_rank]


def dealt_nodes(config: TokenizeConfig) -> int | None:
    """The node count this process deals units by, to record or check; None when it deals none of its own
    (--finalize, or Ray, whose tasks take every unit still missing, whatever count began the run)."""
    if config.finalize:
        return config.num_nodes
    return None if config.executor is ExecutorKind.RAY else (config.num_nodes or 1)


def rerun_hint(missing: list[int], first: int = 0, num_nodes: int | None = None) -> str:
    """Which nodes to rerun for the ``missing`` units of a dataset whose units are dealt from ``first`` on."""
    if num_nodes is not None and num_nodes > 1:
        ranks = ", ".join(str(r) for r in sorted({(first + u) % num_nodes for u in missing}))
        return f"Rerun --node-rank {ranks} of --num-nodes {num_nodes} (the nodes that own them), then --finalize"
    owner = "u % --num-nodes"
    if first:
        owner = f"(u + {first}) % --num-nodes: a tree deals units across its leaves in order"
    return f"Rerun the nodes that own them (unit u belongs to --node-rank {owner}), then --finalize"


def pending_units(config: TokenizeConfig, plan: UnitPlan, first: int = 0) -> list[int]:
    """This node's units without a done marker, in unit order; their killed writers' temps are removed."""
    mine = [u for u in node_units(config, len(plan.units), first) if not done_path(config.output_dir, u).exists()]
    remove_unit_temps(config.output_dir, set(mine))
    return mine


def add_counts(total: Counts, part: Counts) -> None:
    total.documents += part.documents
    total.input_bytes += part.input_bytes
    for mine, theirs in ((total.skipped, part.skipped), (total.dropped, part.dropped)):
        for kind, count in theirs.items():
            mine[kind] = mine.get(kind, 0) + count
