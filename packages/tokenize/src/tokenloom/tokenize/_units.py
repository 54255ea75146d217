"""A unit-planned run: many nodes (or Ray tasks) write one dataset, byte-identical to one process.

    RunInputs -> UnitPlan (sorted inputs with sizes/mtimes/hashes, settings, tokenizer; units = whole files, or
        line-aligned byte ranges / parquet row-group runs of files over --unit-bytes: _unit_parts)
        -> OUT/.tokenloom-plan.json (the first node creates it; the others verify it is equal)
    node R of N: its units (u % N == R) without a done marker, in order
        -> encoded (local pool, or Ray tasks: _ray) -> UnitWriter: unit shards, then the done marker (atomic create)
    the last node to finish (or ``--finalize``): every unit committed -> manifest.json, under the output lock

A unit's shards depend only on its input's bytes and the settings, so a node killed
anywhere costs at most its unit in flight, and no interleaving of nodes changes a byte.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tokenloom.formats import (
    ConfigError,
    DataError,
    Manifest,
    OutputLockedError,
    ResumeMismatchError,
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
    write_manifest,
)
from tokenloom.tokenize._config import ExecutorKind, TokenizeConfig
from tokenloom.tokenize._executor import encoding_for
from tokenloom.tokenize._native import replaceable, summary_of
from tokenloom.tokenize._plan import RunInputs
from tokenloom.tokenize._ray import encode_with_ray, preflight
from tokenloom.tokenize._state import STATE_NAME, Counts
from tokenloom.tokenize._summary import ProgressCallback, TokenizeSummary, report_progress
from tokenloom.tokenize._transform import transform_for
from tokenloom.tokenize._unit_files import (
    PLAN_NAME,
    UnitDone,
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
    unit_stem,
)
from tokenloom.tokenize._unit_records import (
    clear_record_output,
    encode_records,
    is_record_store_file,
    merged,
    publish_records,
    record_summary,
    records_complete,
)
from tokenloom.tokenize._unit_work import Session, UnitWriter, add_counts, dealt_nodes, pending_units, rerun_hint
from tokenloom.tokenize.inputs import cut_units, read_chunks
from tokenloom.tokenize.windowing import Windowing

__all__ = [
    "encode_local",
    "finalize",
    "missing_units",
    "plan_of",
    "prepare_units_dir",
    "run_units",
    "write_unit_manifest",
]

log = logging.getLogger("tokenloom.tokenize")


def plan_of(config: TokenizeConfig, inputs: RunInputs) -> UnitPlan:
    run_key = {**inputs.run_key(config), "layout": "units", "unit_bytes": config.unit_bytes}
    return UnitPlan(run_key, tuple(cut_units(inputs.files, config.unit_bytes)))


def run_units(
    config: TokenizeConfig, inputs: RunInputs, *, on_progress: ProgressCallback | None = None
) -> TokenizeSummary:
    """This node's share of a unit-planned run (or, with --finalize, only the manifest); see the module docstring."""
    started = time.perf_counter()
    out = config.output_dir
    plan = plan_of(config, inputs)
    if config.train_type is not None:  # the record transform: post-training records into a record store
        return _run_record_units(config, inputs, plan, started, on_progress)
    complete = None if config.overwrite else _complete(out, plan)
    if complete is not None:
        summary = summary_of(complete, out, time.perf_counter() - started)
        summary.already_complete = True
        return summary
    if config.executor is ExecutorKind.RAY and not config.finalize:
        preflight(config)  # an unreachable cluster fails before anything is written
    prepare_units_dir(config)
    establish_plan(out, plan)
    num_nodes = establish_nodes(out, plan, dealt_nodes(config))  # another --num-nodes than the run's: ConfigError
    (out / WRITING_MARKER).touch()
    fsync_dir(out)
    session = Session()
    if not config.finalize:
        if config.executor is ExecutorKind.RAY:
            session = encode_with_ray(config, inputs, plan, on_progress)
        else:
            session = encode_local(config, inputs, plan, on_progress)
            mark_node_finished(out, config.node_rank)
    everyone = not config.finalize and num_nodes is not None and finished_nodes(out, num_nodes) == num_nodes
    manifest = finalize(
        out, plan, inputs.tokenizer, required=config.finalize or everyone, num_nodes=num_nodes, everyone=everyone
    )
    seconds = time.perf_counter() - started
    summary = summary_of(manifest, out, seconds) if manifest else _partial_summary(out, plan, session, seconds)
    summary.examples = session.examples
    summary.run_tokens = session.tokens
    summary.bytes_read = session.bytes_read
    summary.text_bytes = session.text_bytes
    summary.units_committed = session.units
    return summary


def _run_record_units(
    config: TokenizeConfig, inputs: RunInputs, plan: UnitPlan, started: float, on_progress: ProgressCallback | None
) -> TokenizeSummary:
    """The same plan, dealing, done markers and last-node finalize; the units hold records, merged into one store."""
    out = config.output_dir
    published = None if config.overwrite else records_complete(out, plan)
    if published is not None:
        summary = record_summary(out, published, {}, 0)
        summary.already_complete = True
        return summary
    if config.executor is ExecutorKind.RAY and not config.finalize:
        preflight(config)
    transform_for(config, inputs.tokenizer)  # a tokenizer without a chat template fails before anything is written
    prepare_units_dir(config)
    establish_plan(out, plan)
    num_nodes = establish_nodes(out, plan, dealt_nodes(config))  # another --num-nodes than the run's: ConfigError
    (out / WRITING_MARKER).touch()
    fsync_dir(out)
    units, counts = (0, {}) if config.finalize else encode_records(config, inputs.tokenizer, plan, on_progress)
    if not config.finalize and config.executor is not ExecutorKind.RAY:
        mark_node_finished(out, config.node_rank)
    everyone = not config.finalize and num_nodes is not None and finished_nodes(out, num_nodes) == num_nodes
    publish = lambda: _published_records(out, plan, config, inputs.tokenizer)  # noqa: E731
    if merged(out):  # a publish was killed after the merge: finish it (the done markers may be gone)
        with output_lock(out, what="--output-dir"):
            sidecar = publish()
    else:
        sidecar = finalize(
            out,
            plan,
            inputs.tokenizer,
            required=config.finalize or everyone,
            num_nodes=num_nodes,
            everyone=everyone,
            publish=publish,
        )
    summary = record_summary(out, sidecar, counts, units)
    if sidecar is None:
        summary.units_total = len(plan.units)
        summary.units_missing = len(missing_units(out, plan))
    summary.seconds = time.perf_counter() - started
    return summary


def _published_records(out: Path, plan: UnitPlan, config: TokenizeConfig, tokenizer: str) -> dict[str, Any]:
    """The record store published, then the node records removed (as after a text run's manifest)."""
    sidecar = publish_records(out, plan, config, tokenizer)
    remove_node_records(out)
    fsync_dir(out)
    return sidecar


def _complete(out: Path, plan: UnitPlan) -> Manifest | None:
    """The manifest of a finished run with this plan, None if there is none; another run's is a mismatch."""
    if not (out / MANIFEST_NAME).is_file() or (out / WRITING_MARKER).exists():
        return None
    manifest = read_manifest(out)
    recorded = manifest.metadata.get("tokenize", {})
    if {k: recorded.get(k) for k in plan.run_key} != plan.run_key:
        from tokenloom.tokenize._diff import run_key_differences

        raise ResumeMismatchError(
            "the output directory holds a dataset written with other settings, tokenizer, inputs or layout: "
            + "; ".join(run_key_differences(recorded, plan.run_key) + _layout_difference(recorded)),
            path=out,
            hint="Pass --overwrite to replace it, or choose another --output-dir",
        )
    return manifest


def _layout_difference(recorded: dict[str, Any]) -> list[str]:
    layout = recorded.get("layout", "single-process")
    return [] if layout == "units" else [f"layout {layout!r} -> 'units' (--num-nodes / --executor ray)"]


def prepare_units_dir(config: TokenizeConfig) -> None:
    out = config.output_dir
    if out.exists() and not out.is_dir():
        raise ConfigError("the output path exists and is not a directory", path=out, field="output_dir")
    if config.overwrite and out.exists() and config.train_type is not None:
        clear_record_output(out)
        return
    if config.overwrite and out.exists():
        prepare_output_dir(out, overwrite=True, ours=replaceable(out))
        return
    out.mkdir(parents=True, exist_ok=True)  # nodes may race here: exist_ok
    if (out / STATE_NAME).exists():
        raise ResumeMismatchError(
            "the output directory holds an unfinished single-process tokenize run (no --num-nodes)",
            path=out / STATE_NAME,
            hint="Finish it with the command that started it (without --num-nodes), pass --overwrite, "
            "or choose another --output-dir",
        )
    if (out / MANIFEST_NAME).exists() and not (out / PLAN_NAME).exists():
        raise ResumeMismatchError(
            "the output directory holds a dataset that is not unit-planned",
            path=out,
            hint="Pass --overwrite to replace it, or choose another --output-dir",
        )
    foreign = sorted(p.name for p in out.iterdir() if not _ours(p.name))
    if foreign:
        raise ConfigError(
            f"the output directory holds files that no tokenize run wrote: {', '.join(foreign[:5])}",
            path=out,
            field="output_dir",
            hint="Choose an empty --output-dir",
        )


def _ours(name: str) -> bool:
    return (
        is_unit_file(name)
        or is_record_store_file(name)
        or name in (WRITING_MARKER, MANIFEST_NAME)
        or name.startswith(MANIFEST_NAME + ".")
    )


def encode_local(
    config: TokenizeConfig, inputs: RunInputs, plan: UnitPlan, on_progress: ProgressCallback | None
) -> Session:
    session = Session()
    mine = pending_units(config, plan)
    if not mine:
        return session
    sources = [plan.units[u] for u in mine]
    # the engine probe reads the same first documents (inputs.files) on every node
    with encoding_for(config, inputs.tokenizer, inputs.files) as encoding:
        facts = UnitFacts(encoding.dtype.name, encoding.info.vocab_size, encoding.eos_id, encoding.engine.record)
        session.facts = facts
        chunks = read_chunks(
            [s.file for s in sources],
            chunk_lines=config.chunk_lines,
            chunk_bytes=config.chunk_bytes,
            max_line_bytes=config.max_line_bytes,
            text_field=config.text_field,
            parts=[s.part for s in sources],
        )
        writer: UnitWriter | None = None
        try:
            for result in encoding.results(chunks):
                if writer is None or writer.unit != mine[result.file_index]:
                    if writer is not None:
                        _committed(session, writer.commit(), writer)
                    unit = mine[result.file_index]
                    writer = UnitWriter(config, unit, plan.units[unit], facts, plan.digest)
                writer.consume(result)
                session.tokens += len(result.tokens)
                session.bytes_read += result.source_bytes
                session.text_bytes += result.num_bytes
                report_progress(
                    on_progress, result.documents, len(result.tokens), result.source_bytes, result.num_bytes
                )
            if writer is not None:
                _committed(session, writer.commit(), writer)
        except BaseException:
            if writer is not None:
                writer.abort()  # its shards stay invisible to readers: no done marker names them
            raise
    return session


def _committed(session: Session, done: UnitDone, writer: UnitWriter) -> None:
    session.units += 1
    add_counts(session.counts, done.counts)
    session.examples += writer.examples


def missing_units(out: Path, plan: UnitPlan) -> list[int]:
    return [u for u in range(len(plan.units)) if not done_path(out, u).exists()]


def finalize(
    out: Path,
    plan: UnitPlan,
    tokenizer: str,
    *,
    required: bool,
    first: int = 0,
    num_nodes: int | None = None,
    everyone: bool = False,
    publish: Callable[[], Any] | None = None,
) -> Any:
    """Write the manifest once every unit is committed; None (or, if ``required``, an error) otherwise.

    ``first``, ``num_nodes``: how the units were dealt to nodes, for the error's list of nodes to rerun.
    ``everyone``: every node has finished, so a unit still missing was taken by no node (said as such).
    ``publish``: what the unit writer's outputs become (default: the manifest of the unit shards).
    """
    missing = missing_units(out, plan)
    if missing:
        if not required:
            return None
        shown = ", ".join(f"{u} ({plan.units[u].label})" for u in missing[:10])
        why = (
            f"every node of --num-nodes {num_nodes} has finished, yet {len(missing)} of {len(plan.units)} units "
            f"were taken by no node: {shown}"
            if everyone
            else f"{len(missing)} of {len(plan.units)} units are not committed yet: {shown}"
        )
        raise DataError(
            why + (" ..." if len(missing) > 10 else ""),
            path=out,
            hint=rerun_hint(missing, first, num_nodes),
        )
    try:
        with output_lock(out, what="--output-dir"):
            return publish() if publish is not None else write_unit_manifest(out, plan, tokenizer)
    except OutputLockedError:
        if required:
            raise
        log.info("another process holds the output lock (finalizing); this node leaves the manifest to it")
        return None


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
        add_counts(counts, done.counts)
        for record in done.shards:
            stem = unit_stem(done.unit, record.index)
            files.append(FileEntry(f"{stem}.idx", record.idx_bytes, record.idx_xxh3_128, "index"))
            files.append(record.bin_entry(stem))
    settings = plan.run_key["settings"]
    placement = {EOS_PLACEMENT: EOS_AT_DOCUMENT_END} if settings.get("windowing") == Windowing.GPT_SIMPLE.value else {}
    manifest = Manifest(
        format="native",
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


def _partial_summary(out: Path, plan: UnitPlan, session: Session, seconds: float) -> TokenizeSummary:
    facts = session.facts
    summary = TokenizeSummary(
        output_dir=out,
        documents=session.counts.documents,
        input_bytes=session.counts.input_bytes,
        seconds=seconds,
        skipped=dict(session.counts.skipped),
        dropped=dict(session.counts.dropped),
        dtype=facts.dtype if facts else "",
        eos_id=facts.eos_id if facts else -1,
        vocab_size=facts.vocab_size if facts else 0,
    )
    summary.units_total = len(plan.units)
    summary.units_missing = len(missing_units(out, plan))
    return summary
