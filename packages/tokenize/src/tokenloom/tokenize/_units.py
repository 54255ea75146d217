"""tokenize's one pipeline: a unit plan, run by one process (N=1), many nodes or Ray tasks, byte-identical.

    RunInputs -> UnitPlan (sorted inputs with sizes/mtimes/hashes, settings, tokenizer; units = whole files, or
        line-aligned byte ranges / parquet row-group runs of files over --unit-bytes: _unit_parts)
        -> OUT/.tokenloom-plan.json (the first node creates it; the others verify it is equal)
    node R of N: its units (u % N == R) without a done marker, in order
        -> encoded (local pool, or Ray tasks: _ray) -> UnitWriter: unit shards, then the done marker (atomic create)
    the last node to finish (or ``--finalize``): every unit committed -> manifest.json, under the output lock

A unit's shards depend only on its input's bytes and the settings, so a node killed
anywhere costs at most its unit in flight, and no interleaving of nodes changes a byte.
A single process (no --num-nodes) is node 0 of 1 and holds the output lock for the whole run; a data
error there (or a kill before any unit is committed) leaves nothing behind, as a run that never started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tokenloom.formats import (
    ConfigError,
    DataError,
    Manifest,
    OutputLockedError,
    ResumeMismatchError,
    available_formats,
    read_manifest,
)
from tokenloom.formats.io import (
    EOS_AT_DOCUMENT_END,
    EOS_PLACEMENT,
    MANIFEST_NAME,
    WRITING_MARKER,
    FileEntry,
    fsync_dir,
    output_lock,
    prepare_output_dir,
    temp_base,
    write_manifest,
)
from tokenloom.tokenize._config import UNIT_FORMAT, ExecutorKind, TokenizeConfig, supported_formats
from tokenloom.tokenize._diff import check_run_key
from tokenloom.tokenize._executor import WorkerDiedError, start_encoding
from tokenloom.tokenize._plan import RunInputs
from tokenloom.tokenize._ray import preflight
from tokenloom.tokenize._summary import ProgressCallback, TokenizeSummary, summary_of_record
from tokenloom.tokenize._tree import TreeDataset, datasets_of, encode_groups, first_units
from tokenloom.tokenize._unit_files import (
    PLAN_NAME,
    Counts,
    UnitFacts,
    UnitPlan,
    done_path,
    establish_nodes,
    establish_plan,
    finished_nodes,
    is_unit_file,
    mark_node_finished,
    read_done,
    remove_node_records,
    remove_unit_temps,
    uncommitted_error,
    unit_stem,
)
from tokenloom.tokenize._unit_work import (
    IN_PLACE,
    Delivery,
    Session,
    UnitOutput,
    pending_units,
    run_unit_tasks,
    write_text_unit,
)
from tokenloom.tokenize.engine import EngineMismatchError
from tokenloom.tokenize.windowing import Windowing

__all__ = [
    "finalize",
    "manifest_complete",
    "missing_units",
    "open_units_dir",
    "prepare_units_dir",
    "replaceable",
    "run_units",
    "summary_of",
    "text_summary",
    "unit_output",
    "write_unit_manifest",
]

log = logging.getLogger("tokenloom.tokenize")

#: The resume journal of the single-process layout before the one pipeline (shard_NNNNN.bin/.idx beside it).
OLD_JOURNAL = ".tokenloom-tokenize-state.json"
_OLD_SHARD = re.compile(r"shard_\d+\.(bin|idx)")
_RUN_RECORD = "tokenize.json"


def run_units(
    config: TokenizeConfig, inputs: RunInputs, *, on_progress: ProgressCallback | None = None
) -> TokenizeSummary:
    """This node's share of every dataset of a unit-planned run (one, or a tree's leaves; with --finalize only the
    manifests); see the module docstring.

    What a unit holds is its transform's (_transform): token shards (text -> documents) or a record store
    (--train-type: conversations -> sft / dpo / grpo records); the plan, dealing, commits and finalize are one.
    """
    started = time.perf_counter()
    groups = datasets_of(config, inputs)
    targets = [target for group in groups for target in group]
    firsts = [first for group, first in zip(groups, first_units(groups), strict=True) for _ in group]
    output = unit_output(config, inputs.tokenizer)
    published = [None if config.overwrite else output.complete(t.out, t.plan) for t in targets]
    if all(p is not None for p in published):  # a dataset complete with this plan stays as it is
        summary = output.summary(config.output_dir, targets, published, Session(), time.perf_counter() - started)
        summary.already_complete = True
        return summary
    if config.executor is ExecutorKind.RAY and not config.finalize:
        preflight(config.ray_address)  # an unreachable cluster fails before anything is written
    output.check()
    created = not config.output_dir.exists()
    pairs = zip(targets, published, strict=True)
    recorded = [open_units_dir(t.config, t.plan) if p is None else None for t, p in pairs]
    session = Session()
    if not config.finalize:
        try:
            session = output.encode(inputs, groups, on_progress, IN_PLACE)
        except BaseException as error:
            if config.nodes.alone and not config.many_datasets:
                _leave_nothing(config.output_dir, created=created, error=error)
            raise
        if config.executor is not ExecutorKind.RAY:
            for target, done in zip(targets, published, strict=True):
                if done is None:
                    mark_node_finished(target.out, config.nodes.rank)
    for i, (target, first, nodes) in enumerate(zip(targets, firsts, recorded, strict=True)):
        if published[i] is not None:
            continue
        out, publish = target.out, functools.partial(output.publish, target.out, target.plan)
        everyone = not config.finalize and nodes is not None and finished_nodes(out, nodes) == nodes
        if output.publishing(out):  # a publish was killed midway, or another node publishes now: finish it or wait
            published[i] = _locked(out, publish, wait=nodes is not None)
        else:
            required = config.finalize or everyone
            published[i] = finalize(
                out, target.plan, publish, required=required, first=first, recorded=nodes, everyone=everyone
            )
    return output.summary(config.output_dir, targets, published, session, time.perf_counter() - started)


class TokenShards:
    """Text -> documents: each unit's token shards, the manifest at finalize (a native dataset)."""

    def __init__(self, config: TokenizeConfig, tokenizer: str) -> None:
        self.config = config
        self.tokenizer = tokenizer

    def complete(self, out: Path, plan: UnitPlan) -> Manifest | None:
        return manifest_complete(out, plan)

    def check(self) -> None:
        """Nothing to check before writing: the encoder's probe runs at the start of encoding."""

    def encode(
        self,
        inputs: RunInputs,
        groups: list[list[TreeDataset]],
        on_progress: ProgressCallback | None,
        delivery: Delivery,
    ) -> Session:
        if self.config.executor is not ExecutorKind.RAY:
            return encode_groups(self.config, inputs, groups, on_progress, delivery.on_commit)
        plan = groups[0][0].plan  # one dataset (_config refuses Ray for a tree): a Ray task per pending unit
        pending = delivery.units
        if pending is None:
            pending = pending_units(self.config.output_dir, self.config.nodes, plan)
        if not pending:
            return Session()
        options = dataclasses.replace(self.config.encode_options(), num_workers=0)
        with start_encoding(inputs.tokenizer, inputs.files, options) as encoding:  # the driver's engine and facts
            facts = UnitFacts.of(encoding)
        args = (encoding.settings, facts)
        session = run_unit_tasks(self.config, write_text_unit, args, plan, pending, on_progress, upload=delivery.upload)
        session.facts = facts
        return session

    def publishing(self, out: Path) -> bool:
        return False  # the manifest is one atomic write

    def publish(self, out: Path, plan: UnitPlan) -> Manifest:
        return write_unit_manifest(out, plan, self.tokenizer)

    def summary(
        self, out: Path, targets: list[TreeDataset], published: list[Any], session: Session, seconds: float
    ) -> TokenizeSummary:
        return text_summary(out, targets, published, session, seconds, datasets=self.config.many_datasets)


def text_summary(
    out: Path,
    targets: list[TreeDataset],
    published: list[Manifest | None],
    session: Session,
    seconds: float,
    *,
    datasets: bool,
) -> TokenizeSummary:
    """One summary over the run's datasets: their manifests once every one is published, else what this process
    encoded and the units still missing (``datasets``: name the datasets, a tree's or a --val-fraction run's)."""
    unfinished = [t for t, m in zip(targets, published, strict=True) if m is None]
    if unfinished:
        facts = session.facts
        summary = TokenizeSummary(
            output_dir=out,
            documents=session.counts.documents,
            input_bytes=session.counts.input_bytes,
            skipped=dict(session.counts.skipped),
            dropped=dict(session.counts.dropped),
            dtype=facts.dtype if facts else "",
            eos_id=facts.eos_id if facts else -1,
            vocab_size=facts.vocab_size if facts else 0,
        )
        summary.units_total = sum(len(t.plan.units) for t in unfinished)
        summary.units_missing = sum(len(missing_units(t.out, t.plan)) for t in unfinished)
    else:  # the datasets' sums; dtype, EOS, vocabulary and engine: the last one's (one tokenizer)
        parts = [summary_of(manifest, out, seconds) for manifest in published]  # pyright: ignore[reportArgumentType]
        sums = {key: sum(getattr(p, key) for p in parts) for key in ("documents", "entries", "tokens", "input_bytes")}
        summary = dataclasses.replace(parts[-1], **sums, shards=sum(p.shards for p in parts))
        summary.skipped = dict(sum((Counter(p.skipped) for p in parts), Counter()))
        summary.dropped = dict(sum((Counter(p.dropped) for p in parts), Counter()))
    summary.seconds = seconds
    summary.add_session(session)
    summary.resumed_units = session.resumed
    if session.facts is not None:  # this session's engine (the manifest names unit 0's)
        summary.engine, summary.engine_reason = session.facts.engine["name"], session.facts.engine.get("reason", "")
    if datasets:
        summary.datasets = sorted(t.name for t in targets)
    return summary


def unit_output(config: TokenizeConfig, tokenizer: str) -> UnitOutput:
    """What a unit holds, by the run's transform: token shards, or a --train-type record store."""
    if config.train_type is None:
        return TokenShards(config, tokenizer)
    from tokenloom.tokenize._unit_records import RecordStore  # the keyed stores: imported by a records run only

    return RecordStore(config, tokenizer)


def _leave_nothing(out: Path, *, created: bool, error: BaseException) -> None:
    """A single process's failed run: a data error (raise mode) discards every unit; a kill or any other error
    before the first committed unit leaves no file either (and no OUT if this run created it)."""
    discard = isinstance(error, DataError) and not isinstance(error, (EngineMismatchError, WorkerDiedError))
    with contextlib.suppress(OSError):
        committed = any(path.name.endswith(".done") for path in out.iterdir())
        if committed and not discard:
            return  # committed units stay: the same command resumes after them
        for path in out.iterdir():
            if path.is_dir() and is_unit_file(path.name):
                shutil.rmtree(path)  # a unit's record store
            elif is_unit_file(path.name) or path.name == WRITING_MARKER:
                path.unlink()
        if created and not committed:
            out.rmdir()
        else:
            fsync_dir(out)


def manifest_complete(out: Path, plan: UnitPlan) -> Manifest | None:
    """The manifest of a finished run with this plan, None if there is none; another run's is a mismatch."""
    if not (out / MANIFEST_NAME).is_file() or (out / WRITING_MARKER).exists():
        return None
    manifest = read_manifest(out)
    recorded = manifest.metadata.get("tokenize", {})
    check_run_key(recorded, plan.run_key, out, also=_layout_difference(recorded))
    return manifest


def _layout_difference(recorded: dict[str, Any]) -> list[str]:
    layout = recorded.get("layout", "single-process")
    return [] if layout == "units" else [f"layout {layout!r} (shard_NNNNN, an earlier tokenize) -> 'units'"]


def open_units_dir(config: TokenizeConfig, plan: UnitPlan) -> int | None:
    """OUT ready for this node's units (plan and node count written or checked); the run's node count."""
    out = config.output_dir
    prepare_units_dir(config)
    establish_plan(out, plan)
    recorded = establish_nodes(out, plan, config.nodes.recorded)
    (out / WRITING_MARKER).touch()
    fsync_dir(out)
    return recorded


def prepare_units_dir(config: TokenizeConfig) -> None:
    out = config.output_dir
    if out.exists() and not out.is_dir():
        raise ConfigError("the output path exists and is not a directory", path=out, field="output_dir")
    if config.overwrite and out.exists() and config.train_type is not None:
        from tokenloom.tokenize._unit_records import clear_record_output

        clear_record_output(out)
        return
    if config.overwrite and out.exists():
        prepare_output_dir(out, overwrite=True, ours=replaceable(out))
        return
    out.mkdir(parents=True, exist_ok=True)  # nodes may race here: exist_ok
    if (out / OLD_JOURNAL).exists():
        raise ResumeMismatchError(
            "the output directory holds an unfinished run of an earlier tokenize (its resume journal and "
            "shard_NNNNN files), which this version cannot resume",
            path=out / OLD_JOURNAL,
            hint="Pass --overwrite to start afresh, or choose another --output-dir",
        )
    if (out / MANIFEST_NAME).exists() and not (out / PLAN_NAME).exists():
        raise ResumeMismatchError(
            "the output directory holds a dataset that tokenize's unit plan did not write (an earlier tokenize's "
            "shard_NNNNN layout, or another tool's)",
            path=out,
            hint="Pass --overwrite to replace it, or choose another --output-dir",
        )
    foreign = sorted(p.name for p in out.iterdir() if not _ours(p.name))
    if foreign:
        raise ConfigError(
            f"the output directory is not empty: it holds files that no tokenize run wrote: {', '.join(foreign[:5])}",
            path=out,
            field="output_dir",
            hint="Choose an empty --output-dir",
        )


def _ours(name: str) -> bool:
    if is_unit_file(name) or name in (WRITING_MARKER, MANIFEST_NAME) or name.startswith(MANIFEST_NAME + "."):
        return True
    from tokenloom.tokenize._unit_records import is_record_store_file  # the keyed stores: only for other names

    return is_record_store_file(name)


def replaceable(out: Path) -> Callable[[str], bool]:
    """Names in ``out`` that --overwrite may delete: files of a tokenize run of any format or layout."""
    has_record = (out / _RUN_RECORD).is_file()

    def ours(name: str) -> bool:
        base = temp_base(name)  # a crashed writer's NAME.<pid>-<hex>.tmp stands for NAME
        if _ours(name) or name.endswith(".tmp") or base in (OLD_JOURNAL, _RUN_RECORD):
            return True
        if _OLD_SHARD.fullmatch(base) is not None:
            return True
        return has_record and any(spec.owns_file(base) for spec in converted)

    converted = [spec for name, spec in available_formats().items() if name in supported_formats()]

    return ours


def summary_of(manifest: Manifest, out: Path, seconds: float) -> TokenizeSummary:
    """The summary of a published native dataset, from its manifest."""
    return summary_of_record(
        out,
        manifest.metadata.get("tokenize", {}),
        entries=manifest.num_documents,
        tokens=manifest.num_tokens,
        shards=sum(1 for f in manifest.files if f.name.endswith(".idx")),
        seconds=seconds,
        dtype=manifest.dtype,
        eos_id=manifest.eos_id if manifest.eos_id is not None else -1,
        vocab_size=manifest.vocab_size or 0,
    )


def missing_units(out: Path, plan: UnitPlan) -> list[int]:
    return [u for u in range(len(plan.units)) if not done_path(out, u).exists()]


def finalize(
    out: Path,
    plan: UnitPlan,
    publish: Callable[[], Any],
    *,
    required: bool,
    first: int = 0,
    recorded: int | None = None,
    everyone: bool = False,
) -> Any:
    """``publish()`` (the manifest, or what the units become) once every unit is committed; None (or, if
    ``required``, an error) otherwise.

    ``first``, ``recorded`` (the run's node count): how the units were dealt, for the error's nodes to rerun.
    ``everyone``: every node has finished, so a unit still missing was taken by no node (said as such).
    """
    missing = missing_units(out, plan)
    if missing:
        if not required:
            return None
        raise uncommitted_error(plan, missing, path=out, recorded=recorded, everyone=everyone, first=first)
    try:  # every node finished: the one holding the lock publishes; the others wait, then find it published
        return _locked(out, publish, wait=everyone)
    except OutputLockedError:
        if required:
            raise
        log.info("another process holds the output lock (finalizing); this node leaves the manifest to it")
        return None


def _locked(out: Path, publish: Callable[[], Any], *, wait: bool, patience: float = 600.0) -> Any:
    """``publish()`` under OUT's writer lock. ``wait``: another node of this run may hold it to publish the same
    output (both saw every node finished); wait for its release, then publish, which finds the work done (a
    publish is idempotent). Before, the second node failed with OutputLockedError (seen in CI: 2 nodes, grpo)."""
    deadline = time.monotonic() + patience
    while True:
        try:
            with output_lock(out, what="--output-dir"):
                return publish()
        except OutputLockedError:
            if not wait or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def write_unit_manifest(out: Path, plan: UnitPlan, tokenizer: str, sizes: dict[str, int] | None = None) -> Manifest:
    """The manifest of a run whose every unit is committed (``sizes``: shard sizes in object storage)."""
    if (out / MANIFEST_NAME).is_file() and not (out / WRITING_MARKER).exists():
        return read_manifest(out)
    units = [read_done(out, u, plan.digest, sizes) for u in range(len(plan.units))]
    remove_unit_temps(out, set(range(len(plan.units))))  # a killed attempt's leftovers (Ray retries, kills)
    facts = units[0].facts
    first = (facts.dtype, facts.vocab_size, facts.eos_id)
    for done in units[1:]:
        if (done.facts.dtype, done.facts.vocab_size, done.facts.eos_id) != first:
            raise ResumeMismatchError(
                f"unit {done.unit} was encoded with dtype {done.facts.dtype}, vocab {done.facts.vocab_size}, "
                f"eos_id {done.facts.eos_id}; unit 0 with {facts.dtype}, {facts.vocab_size}, {facts.eos_id}",
                path=done_path(out, done.unit),
                hint="Every node must use the same tokenizer and --eos-id; start afresh into an empty --output-dir",
            )
    counts = Counts()
    files: list[FileEntry] = []
    for done in units:
        counts.add(done.counts)
        for record in done.shards:
            stem = unit_stem(done.unit, record.index)
            files.extend(record.entries(stem))
    settings = plan.run_key["settings"]
    placement = {EOS_PLACEMENT: EOS_AT_DOCUMENT_END} if settings.get("windowing") == Windowing.GPT_SIMPLE.value else {}
    manifest = Manifest(
        format=UNIT_FORMAT,
        dtype=facts.dtype,
        num_tokens=sum(r.num_tokens for done in units for r in done.shards),
        num_documents=sum(r.num_entries for done in units for r in done.shards),
        files=tuple(files),
        vocab_size=facts.vocab_size,
        eos_id=facts.eos_id,
        tokenizer_fingerprint=plan.run_key["tokenizer_fingerprint"],
        metadata={
            **placement,
            "tokenize": {
                **plan.run_key,
                "units": len(plan.units),
                "tokenizer": tokenizer,
                "engine": facts.engine,
                "documents": counts.documents,
                "input_bytes": counts.input_bytes,
                "skipped": dict(sorted(counts.skipped.items())),
                **({"dropped": dict(sorted(counts.dropped.items()))} if counts.dropped else {}),
            },
        },
    )
    manifest = write_manifest(out, manifest)
    (out / WRITING_MARKER).unlink(missing_ok=True)
    remove_node_records(out)
    fsync_dir(out)
    return manifest
