"""The work of a unit: its writer (shards, then the done marker), the units a node still owes, the one loop that
encodes units' chunks (_tree.encode_groups: the local pool over a run's leaves; write_text_unit: one unit whole),
and the one executor of whole units (run_unit_tasks: Ray tasks, a process pool or this process; text and records).

A unit is written the same way by the local pool and by a unit task: the same loop, the same writer.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tokenloom.formats import RecordError
from tokenloom.tokenize._config import ExecutorKind, TokenizeConfig
from tokenloom.tokenize._executor import spawn_pool
from tokenloom.tokenize._plan import RunInputs
from tokenloom.tokenize._ray import Upload, ray_tasks, run_unit_task
from tokenloom.tokenize._shards import ShardCutter
from tokenloom.tokenize._summary import EXAMPLES_PER_KIND, ProgressCallback, TokenizeSummary, report_progress
from tokenloom.tokenize._transform import transform_for, unit_line
from tokenloom.tokenize._unit_files import (
    Counts,
    Nodes,
    OnError,
    UnitDone,
    UnitFacts,
    UnitOptions,
    UnitPlan,
    create_once,
    done_path,
    remove_unit_temps,
    unit_stem,
)
from tokenloom.tokenize._worker import ChunkResult, EncodeSettings
from tokenloom.tokenize.engine import EngineMismatchError
from tokenloom.tokenize.inputs import Chunk, UnitSource, read_chunks

__all__ = [
    "IN_PLACE",
    "Delivery",
    "Session",
    "UnitOutput",
    "UnitWriter",
    "add_stats",
    "encode_units",
    "pending_units",
    "run_unit_tasks",
    "write_text_unit",
]

log = logging.getLogger("tokenloom.tokenize")


@dataclass(slots=True)
class Session:
    """What this process (or its Ray tasks) encoded."""

    counts: Counts = field(default_factory=Counts)
    examples: list[str] = field(default_factory=list)
    facts: UnitFacts | None = None
    records: dict[str, Any] = field(default_factory=dict)
    """--train-type: the post-training counts of the units this session wrote."""
    units: int = 0
    resumed: int = 0
    """Units of this node committed before this session (a rerun resumes after them)."""
    tokens: int = 0
    bytes_read: int = 0
    text_bytes: int = 0

    def add(self, other: Session) -> None:
        """Count a unit task's session (a whole unit written elsewhere: a Ray task, a pool worker)."""
        self.units += other.units
        self.tokens += other.tokens
        self.bytes_read += other.bytes_read
        self.text_bytes += other.text_bytes
        self.counts.add(other.counts)
        self.examples += other.examples
        if other.records:
            self.records = add_stats(self.records, other.records)


def add_stats(total: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    """The sum of two record units' counts (errors summed by name)."""
    merged = {k: total.get(k, 0) + v for k, v in part.items() if k != "errors"}
    errors = Counter(total.get("errors", {})) + Counter(part.get("errors", {}))
    merged["errors"] = dict(sorted(errors.items()))
    return merged


@dataclass(frozen=True, slots=True)
class Delivery:
    """Where a run's committed units go besides their directory: ``on_commit(out, unit)`` after each local commit
    (a bucket's upload queue, _publish); a Ray run into a bucket encodes only ``units`` (those missing at the
    URL), each task handing its staged unit to ``upload(staging, unit)``."""

    on_commit: Callable[[Path, int], None] | None = None
    units: list[int] | None = None
    upload: Callable[[Path, int], None] | None = None


#: Units committed in their directory and nothing more (a local output).
IN_PLACE = Delivery()


class UnitOutput(Protocol):
    """What a unit-planned run's units hold and become: token shards and a manifest (_units.TokenShards), or
    record stores merged into one (_unit_records.RecordStore); the plan, dealing and commits are the same."""

    def complete(self, out: Path, plan: UnitPlan) -> Any:
        """What a finished run with this plan published (None: nothing; another plan's: ResumeMismatchError)."""
        ...

    def check(self) -> None:
        """Fail before anything is written (a tokenizer without a chat template, ...)."""
        ...

    def encode(
        self, inputs: RunInputs, groups: list[list[Any]], on_progress: ProgressCallback | None, delivery: Delivery
    ) -> Session:
        """This node's pending units of the run's datasets (``groups``: _tree.datasets_of; with Ray, every pending
        unit), each committed by its done marker, then delivered (``delivery``)."""
        ...

    def publishing(self, out: Path) -> bool:
        """A publish was killed midway (it finishes without every done marker)."""
        ...

    def publish(self, out: Path, plan: UnitPlan) -> Any:
        """Every unit committed: what readers open, published under the output lock."""
        ...

    def summary(
        self, out: Path, targets: list[Any], published: list[Any], session: Session, seconds: float
    ) -> TokenizeSummary:
        """One summary over the datasets (``targets``: _tree.TreeDataset) and what each published (None: not yet)."""
        ...


class UnitWriter:
    """Consumes one unit's chunk results in order into its shards; ``commit`` creates its done marker."""

    def __init__(
        self, out: Path, options: UnitOptions, unit: int, source: UnitSource, facts: UnitFacts, plan: str
    ) -> None:
        self.options = options
        self.unit = unit
        self.source = source
        self.cutter = ShardCutter(
            out,
            dtype=np.dtype(facts.dtype),
            shard_size_tokens=options.shard_size_tokens,
            stem=lambda part: unit_stem(unit, part),
        )
        self.facts = facts
        self.plan = plan
        self.counts = Counts()
        self.examples: list[str] = []

    @property
    def out(self) -> Path:
        return self.cutter.directory

    def consume(self, result: ChunkResult) -> None:
        path = self.source.file.shown
        for issue in result.issues:
            line = unit_line(self.source, issue.line)
            if self.options.on_error is OnError.RAISE:
                raise RecordError(issue.message, path=path, offset=issue.offset, record=line, field=issue.kind.value)
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
        self.cutter.finish()
        done = UnitDone(self.unit, self.plan, tuple(self.cutter.records), self.counts, self.facts)
        if not create_once(done_path(self.out, self.unit), done.payload()):
            log.info("unit %d was already committed by another process (its bytes are the same)", self.unit)
        return done

    def abort(self) -> None:
        self.cutter.abort()


def encode_units(
    options: UnitOptions,
    sources: list[UnitSource],
    units: list[int],
    encode: Callable[[Iterator[Chunk]], Iterator[ChunkResult]],
    writers_for: Callable[[int], list[UnitWriter]],
    session: Session,
    on_progress: ProgressCallback | None,
    on_commit: Callable[[Path, int], None] | None = None,
) -> None:
    """Units ``units`` (reading ``sources``) through ``encode`` in order, each into its writers: ``[dataset]``, or
    ``[train, val]`` (a unit's --val-fraction part is its results' ``val``); a unit commits when the next begins."""
    chunks = read_chunks(
        [s.file for s in sources],
        chunk_lines=options.chunk_lines,
        chunk_bytes=options.chunk_bytes,
        max_line_bytes=options.max_line_bytes,
        text_field=options.text_field,
        parts=[s.part for s in sources],
    )
    source_of: dict[int, int] = {}  # chunk index -> its unit's place in ``units``, until its result is in
    writers: list[UnitWriter] = []
    current = -1
    try:
        for result in encode(c for c in chunks if source_of.setdefault(c.index, c.file_index) >= 0):
            del source_of[result.index]
            if units[result.file_index] != current:
                _commit(session, writers, on_commit)
                current = units[result.file_index]
                writers = writers_for(current)
            parts = [result] if result.val is None else [result, result.val]
            for writer, part in zip(writers, parts, strict=False):
                writer.consume(part)
                session.tokens += len(part.tokens)
                session.text_bytes += part.num_bytes
            session.bytes_read += result.source_bytes
            if on_progress is not None:
                documents, tokens = sum(p.documents for p in parts), sum(len(p.tokens) for p in parts)
                report_progress(on_progress, documents, tokens, result.source_bytes, sum(p.num_bytes for p in parts))
        _commit(session, writers, on_commit)
    except EngineMismatchError as error:  # its line counts from its unit's start: name the file's line
        for writer in writers:
            writer.abort()
        if error.record is None or not source_of:
            raise
        line = unit_line(sources[source_of[min(source_of)]], error.record)
        raise EngineMismatchError(
            error.problem, path=error.path, record=line, field=error.field, hint=error.hint
        ) from None
    except BaseException:
        for writer in writers:
            writer.abort()  # their shards stay invisible to readers: no done marker names them
        raise


def _commit(session: Session, writers: list[UnitWriter], on_commit: Callable[[Path, int], None] | None) -> None:
    """Commit a unit's datasets, val before train: a committed train unit means its val part is committed too."""
    for writer in reversed(writers):
        done = writer.commit()
        session.counts.add(done.counts)
        session.examples += writer.examples
        if on_commit is not None:
            on_commit(writer.out, writer.unit)
    if writers:
        session.units += 1
    writers.clear()  # committed: an error after this must not abort them


def write_text_unit(
    config: TokenizeConfig, unit: int, source: UnitSource, settings: EncodeSettings, facts: UnitFacts, plan: str
) -> Session:
    """Encode ``source`` in this process and commit it as unit ``unit`` in ``config.output_dir`` (a unit task)."""
    options, session = config.unit_options(), Session()

    def writers(unit: int) -> list[UnitWriter]:
        return [UnitWriter(config.output_dir, options, unit, source, facts, plan)]

    encode_units(options, [source], [unit], transform_for(settings, settings.tokenizer).encode, writers, session, None)
    session.bytes_read = source.file.size if source.part is None else session.counts.input_bytes
    return session


def run_unit_tasks(
    config: TokenizeConfig,
    write: Callable[..., Session],
    args: tuple[Any, ...],
    plan: UnitPlan,
    units: list[int],
    on_progress: ProgressCallback | None,
    on_commit: Callable[[Path, int], None] | None = None,
    upload: Upload | None = None,
) -> Session:
    """Each of ``units`` written whole and committed by ``write(config, unit, source, *args, plan digest)``: a Ray
    task each (--executor ray; ``upload``: its unit into the output bucket from its machine), a pool of
    --num-workers processes, or this process; their sessions counted in unit order, ``on_commit(OUT, unit)`` after
    each (a bucket output queues its upload)."""
    sessions: Iterable[Session]
    if config.executor is ExecutorKind.RAY:
        calls = [(write, config, u, plan.units[u], args, plan.digest, upload) for u in units]
        sessions = ray_tasks(config.ray_address, run_unit_task, calls)
    elif min(config.num_workers, len(units)) <= 1:
        sessions = (write(config, u, plan.units[u], *args, plan.digest) for u in units)
    else:
        sessions = _pooled(config, write, args, plan, units)
    total = Session()
    for unit, session in zip(units, sessions, strict=False):  # each path yields in the order of ``units``
        total.add(session)
        if on_commit is not None:
            on_commit(config.output_dir, unit)
        report_progress(on_progress, session.counts.documents, session.tokens, session.bytes_read, session.text_bytes)
    return total


def _pooled(
    config: TokenizeConfig, write: Callable[..., Session], args: tuple[Any, ...], plan: UnitPlan, units: list[int]
) -> Iterator[Session]:
    pool = spawn_pool(min(config.num_workers, len(units)))  # tokenize's one pool maker: no fork of tokenizer threads
    try:
        futures = [pool.submit(write, config, u, plan.units[u], *args, plan.digest) for u in units]
        for future in futures:
            yield future.result()
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def pending_units(out: Path, nodes: Nodes, plan: UnitPlan, first: int = 0) -> list[int]:
    """This node's units of ``plan`` without a done marker in ``out``, in unit order; their killed writers' temps
    are removed."""
    mine = [u for u in nodes.units(len(plan.units), first) if not done_path(out, u).exists()]
    remove_unit_temps(out, set(mine))
    return mine
