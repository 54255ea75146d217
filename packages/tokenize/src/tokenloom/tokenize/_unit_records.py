"""Post-training records in the unit-planned pipeline: a unit's records -> its record store, merged in plan order.

    node R's pending units (pending_units: the dealing and done markers of text runs)
        -> each unit: unit_records -> ChatTransform (_transform) -> RecordStoreWriter OUT/unit_UUUUUU_0000.records/
           (its meta.json renamed unit-meta.json: never a part of OUT for a reader), then the unit's done marker
           (its counts) by an atomic create; in this process, a pool of --num-workers processes, or Ray tasks
    the last node (every unit committed), under the output lock (_units.finalize):
        the unit stores concatenated in plan order -> OUT/<key>.bin, post_training.json, MERGED_META
        -> the unit stores and done markers removed -> MERGED_META renamed meta.json -> manifest.json (block
        hashes: a bucket reader verifies every block) -> the writer's marker removed (published); the plan
        stays, so a later run with other settings into OUT is a ResumeMismatchError before anything is written

A unit's store depends only on its input bytes and the settings, so a kill anywhere costs at most the units
in flight, and the merged store is the same bytes for any number of processes, nodes or Ray tasks.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from tokenloom.formats import ConfigError, DataError, FormatError, ResumeMismatchError, available_formats
from tokenloom.formats.io import WRITING_MARKER, atomic_write_bytes, fsync_dir, temp_base, temp_path
from tokenloom.formats.io.manifest import MANIFEST_NAME
from tokenloom.formats.keyed.bin_meta import META_NAME
from tokenloom.formats.keyed.records import POST_TRAINING_SIDECAR, write_record_manifest
from tokenloom.formats.keyed.store import OPTIONAL_TRAIN_TYPE_KEYS, TRAIN_TYPE_KEYS
from tokenloom.tokenize._config import TokenizeConfig
from tokenloom.tokenize._diff import run_key_differences
from tokenloom.tokenize._plan import RunInputs
from tokenloom.tokenize._record_settings import record_format_at
from tokenloom.tokenize._summary import ProgressCallback, TokenizeSummary
from tokenloom.tokenize._unit_files import (
    PLAN_NAME,
    UnitPlan,
    create_once,
    done_path,
    is_unit_file,
    remove_node_records,
    unit_stem,
)
from tokenloom.tokenize._unit_work import Delivery, Session, add_stats, pending_units, run_unit_tasks
from tokenloom.tokenize.inputs import ByteRange, UnitSource

__all__ = [
    "UNIT_META",
    "RecordStore",
    "is_record_store_file",
    "publish_records",
    "records_complete",
    "unit_store",
    "write_record_unit",
]

_STORE_KEYS = frozenset(k for keys in (*TRAIN_TYPE_KEYS.values(), *OPTIONAL_TRAIN_TYPE_KEYS.values()) for k in keys)
#: A committed unit store's meta.json, renamed (no reader takes the unit for a part of OUT's store).
UNIT_META = "unit-meta.json"
#: OUT's meta.json once the merge is complete, before the unit stores are removed; renamed to meta.json last.
MERGED_META = ".tokenloom-records-meta.json"
#: --format h5: the store (AstrAI's H5 layout, records_h5; the file its FormatSpec names), and its name from the
#: merge until it is published.
H5_NAME = "data.h5"
MERGED_H5 = ".tokenloom-records-data.h5.merged"
#: per kind of record store: (the merge's last file, its published name); a format whose FormatSpec names one
#: output file is written as that one HDF5 file, else as a directory published by its meta.json
_LAST_FILE = {"directory": (MERGED_META, META_NAME), "file": (MERGED_H5, H5_NAME)}


def _one_file(config: TokenizeConfig) -> bool:
    """Whether --format's record store is one file (its FormatSpec names an output file: h5), not a directory."""
    return available_formats()[config.format].output_name == H5_NAME


def merged(out: Path) -> bool:
    """The unit stores are merged into OUT (only their removal and the publish may be left to do)."""
    return any((out / name).is_file() for pair in _LAST_FILE.values() for name in pair)


def published(out: Path) -> bool:
    """OUT holds a published record store (its last file, or its manifest, written after it, is in place; the
    writer's marker may remain). A bucket's: the manifest, fetched with the plan and sidecar (not data.h5)."""
    return any((out / name).is_file() for name in (*(name for _, name in _LAST_FILE.values()), MANIFEST_NAME))


def is_record_store_file(name: str) -> bool:
    """A file of the merged record store (or a killed merge's temp of one)."""
    stem = temp_base(name)
    return stem in (META_NAME, POST_TRAINING_SIDECAR, MERGED_META, H5_NAME, MERGED_H5, MANIFEST_NAME) or (
        stem.endswith(".bin") and stem[:-4] in _STORE_KEYS
    )


def clear_record_output(out: Path) -> None:
    """--overwrite of a --train-type output: remove what tokenize wrote there (a foreign file: refused)."""
    foreign = sorted(
        p.name
        for p in out.iterdir()
        if not (is_unit_file(p.name) or is_record_store_file(p.name) or p.name.startswith(".tokenloom"))
    )
    if foreign:
        raise ConfigError(
            f"--overwrite would delete files that no tokenize run wrote: {', '.join(foreign[:5])}",
            path=out,
            field="overwrite",
            hint="Choose another --output-dir, or remove those files yourself",
        )
    (out / WRITING_MARKER).write_bytes(b"")  # unpublished first: no meta.json over missing files
    (out / META_NAME).unlink(missing_ok=True)
    (out / H5_NAME).unlink(missing_ok=True)
    fsync_dir(out)
    for path in out.iterdir():
        if path.name == WRITING_MARKER or path.name.startswith(".tokenloom-lock"):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    fsync_dir(out)


def unit_store(out: Path, unit: int) -> Path:
    return out / f"{unit_stem(unit, 0)}.records"


def write_record_unit(config: TokenizeConfig, unit: int, source: UnitSource, tokenizer: str, plan: str) -> Session:
    """Encode unit ``unit``'s records into its record store, then commit it (the done marker holds its counts)."""
    # loaded here, as below: a text run never imports chat
    from tokenloom.tokenize._transform import in_file, transform_for, unit_records
    from tokenloom.tokenize.chat._write import write_store

    options = config.record_options()
    transform = transform_for(options, tokenizer)
    out = config.output_dir
    store = unit_store(out, unit)
    shutil.rmtree(store, ignore_errors=True)  # a killed attempt's leftovers: the unit is written afresh
    try:
        write_store(store, transform.encoder, unit_records(source, options, transform))
    except DataError as error:
        raise in_file(error, source) from None
    # hidden before the unit is committed: OUT's readers walk subdirectories for meta.json, and a unit store
    # must never look like a part of the published store
    os.replace(store / META_NAME, store / UNIT_META)
    fsync_dir(store)
    counts = transform.counts()
    payload = {"unit": unit, "plan": plan, "counts": counts}
    create_once(done_path(out, unit), orjson.dumps(payload, option=orjson.OPT_SORT_KEYS))
    session = Session(units=1, tokens=counts["tokens"], bytes_read=_source_bytes(source), records=counts)
    session.counts.documents = counts["records"]
    return session


class RecordStore:
    """Post-training: each unit's records (the chat transform's) in a record store, merged into one at finalize."""

    def __init__(self, config: TokenizeConfig, tokenizer: str) -> None:
        self.config = config
        self.tokenizer = tokenizer

    def complete(self, out: Path, plan: UnitPlan) -> dict[str, Any] | None:
        return records_complete(out, plan)

    def check(self) -> None:
        from tokenloom.tokenize._transform import transform_for

        transform_for(self.config.record_options(), self.tokenizer)  # a tokenizer without a chat template fails here

    def encode(
        self, inputs: RunInputs, groups: list[list[Any]], on_progress: ProgressCallback | None, delivery: Delivery
    ) -> Session:
        """This node's pending units (--executor ray: every pending unit, or ``delivery.units``, those not committed
        at the URL), each written by write_record_unit through the one unit-task executor."""
        plan, out = groups[0][0].plan, self.config.output_dir  # one dataset: _record_settings refuses a tree
        mine = delivery.units
        if mine is None:
            mine = [] if merged(out) else pending_units(out, self.config.nodes, plan)  # merged: markers may be gone
            for unit in mine:
                shutil.rmtree(unit_store(out, unit), ignore_errors=True)
        write, args = write_record_unit, (self.tokenizer,)
        return run_unit_tasks(self.config, write, args, plan, mine, on_progress, delivery.on_commit, delivery.upload)

    def publishing(self, out: Path) -> bool:
        return merged(out)

    def publish(self, out: Path, plan: UnitPlan) -> dict[str, Any]:
        """The record store published, then the node records removed (as after a text run's manifest)."""
        sidecar = publish_records(out, plan, self.config, self.tokenizer)
        remove_node_records(out)
        fsync_dir(out)
        return sidecar

    def summary(
        self, out: Path, targets: list[Any], published: list[Any], session: Session, seconds: float
    ) -> TokenizeSummary:
        summary = record_summary(out, published[0], session.records, session.units)
        summary.seconds = seconds
        if published[0] is None:  # other nodes' units are still to come: the CLI says so, not "wrote OUT"
            plan = targets[0].plan
            summary.units_total = len(plan.units)
            summary.units_missing = sum(not done_path(out, u).exists() for u in range(len(plan.units)))
        return summary


def _source_bytes(source: UnitSource) -> int:
    """The input bytes of a unit, for the progress bar (a row-group unit: its share is not known; 0)."""
    if source.part is None:
        return source.file.size
    return source.part.stop - source.part.start if isinstance(source.part, ByteRange) else 0


def records_complete(out: Path, plan: UnitPlan) -> dict[str, Any] | None:
    """The sidecar of a published store with this plan; None if none is published; another plan's: a mismatch."""
    if not published(out) or (out / WRITING_MARKER).exists():
        return None
    plan_path = out / PLAN_NAME
    recorded = orjson.loads(plan_path.read_bytes())["run_key"] if plan_path.is_file() else {}
    if recorded != plan.run_key:
        raise ResumeMismatchError(
            "the output directory holds a record store written with other settings, tokenizer or inputs: "
            + "; ".join(run_key_differences(recorded, plan.run_key) or ["it was not written by tokenize"]),
            path=out,
            hint="Pass --overwrite to replace it, or choose another --output-dir",
        )
    return orjson.loads((out / POST_TRAINING_SIDECAR).read_bytes())


def _read_done(out: Path, unit: int, digest: str) -> dict[str, Any]:
    path = done_path(out, unit)
    try:
        data = orjson.loads(path.read_bytes())
        meta = orjson.loads((unit_store(out, unit) / UNIT_META).read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise FormatError(
            f"unit {unit} is committed but its record store or done marker is unreadable ({exc})",
            path=path,
            hint="Delete the done marker and rerun the node that owns the unit",
        ) from None
    if data.get("plan") != digest:
        raise ResumeMismatchError(
            f"the done marker of unit {unit} belongs to another plan", path=path, hint="Start afresh"
        )
    return {"counts": data["counts"], "meta": meta}


def publish_records(out: Path, plan: UnitPlan, config: TokenizeConfig, tokenizer: str) -> dict[str, Any]:
    """Merge every committed unit's store in plan order into OUT's record store; meta.json last (see module doc).

    Each step is redone or skipped on a rerun after a kill: merge (until MERGED_META exists), remove the
    unit stores and done markers, rename MERGED_META to meta.json, remove the writer's marker.
    """
    published = records_complete(out, plan)
    if published is not None:
        return published
    if not merged(out):  # else a killed publish merged already: its unit stores may be gone
        _merge(out, plan, config, tokenizer)
    for u in range(len(plan.units)):  # before meta.json: a published OUT holds no unit store
        shutil.rmtree(unit_store(out, u), ignore_errors=True)
        done_path(out, u).unlink(missing_ok=True)
    fsync_dir(out)
    for last, name in _LAST_FILE.values():
        if (out / last).is_file():
            os.replace(out / last, out / name)  # published (readers still wait for the marker's removal)
    write_record_manifest(out)  # last before the marker goes (bin-meta or h5): redone whole on a rerun after a kill
    (out / WRITING_MARKER).unlink(missing_ok=True)
    fsync_dir(out)
    return orjson.loads((out / POST_TRAINING_SIDECAR).read_bytes())


def _merge(out: Path, plan: UnitPlan, config: TokenizeConfig, tokenizer: str) -> None:
    """The unit stores concatenated in plan order into OUT's ``<key>.bin`` (or the h5 file), the sidecar, then
    MERGED_META (MERGED_H5)."""
    units = [_read_done(out, u, plan.digest) for u in range(len(plan.units))]
    keys = sorted({key for unit in units for key in unit["meta"]})
    for u, unit in enumerate(units):  # every unit store whole before a byte is merged
        for key in keys:
            _unit_entry(out, u, unit, key, None)
    meta: dict[str, Any] = {}
    h5 = _merge_h5(out, units, keys) if _one_file(config) else None
    for key in keys if h5 is None else ():
        offsets, dtype = [0], None
        target = out / f"{key}.bin"
        tmp = temp_path(target)
        with open(tmp, "wb") as handle:
            for u, unit in enumerate(units):
                entry = _unit_entry(out, u, unit, key, dtype)
                if entry is None:
                    continue
                dtype = dtype or entry["dtype"]
                with open(unit_store(out, u) / f"{key}.bin", "rb") as part:
                    shutil.copyfileobj(part, handle, 8 << 20)
                base = offsets[-1]
                offsets.extend(base + o for o in entry["offsets"][1:])
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
        meta[key] = {"shape": [offsets[-1]], "dtype": dtype, "offsets": offsets}
    stats: dict[str, Any] = {}
    for unit in units:
        stats = add_stats(stats, unit["counts"])
    from tokenloom.tokenize._transform import transform_for
    from tokenloom.tokenize.chat._write import sidecar

    options = config.record_options()
    encoder = transform_for(options, tokenizer).encoder
    template = options.settings()["chat_template_sha256"]
    fsync_dir(out)
    body = sidecar(encoder, stats, tokenizer=tokenizer, template_sha256=template, units=len(plan.units))
    atomic_write_bytes(out / POST_TRAINING_SIDECAR, body)
    if h5 is not None:
        os.replace(h5, out / MERGED_H5)
        fsync_dir(out)
    else:
        atomic_write_bytes(out / MERGED_META, orjson.dumps(meta))


def _unit_entry(out: Path, u: int, unit: dict[str, Any], key: str, dtype: str | None) -> dict[str, Any] | None:
    """Unit ``u``'s meta entry of ``key`` (None: a unit without records lacks it), its dtype the merge's."""
    entry = unit["meta"].get(key)
    if entry is None and unit["counts"]["records"]:
        raise FormatError(f"unit {u}'s record store has no key {key!r}", path=unit_store(out, u))
    if entry is not None and dtype is not None and entry["dtype"] != dtype:
        raise FormatError(f"unit {u} stores {key} as {entry['dtype']}, unit 0 as {dtype}", path=out)
    if entry is not None:  # checked before any byte is merged, as a text unit's shards are
        part = unit_store(out, u) / f"{key}.bin"
        size = int(entry["offsets"][-1]) * np.dtype(entry["dtype"]).itemsize
        found = part.stat().st_size if part.is_file() else None
        if found != size:
            raise ResumeMismatchError(
                f"{part.name} of committed unit {u} is missing or has changed ({size} bytes recorded, "
                f"{'none' if found is None else found} found)",
                path=part,
                hint=f"Delete {done_path(out, u).name} and rerun the node that owns unit {u}",
            )
    return entry


def _unit_key(out: Path, u: int, unit: dict[str, Any], key: str, dtype: str | None) -> tuple[np.ndarray, list[int]]:
    """Unit ``u``'s array of ``key`` (memory-mapped) and its record offsets; a unit without records: empty."""
    entry = _unit_entry(out, u, unit, key, dtype)
    if entry is None:
        return np.zeros(0, dtype=dtype or "uint8"), [0]
    path = unit_store(out, u) / f"{key}.bin"
    data = np.fromfile(path, dtype=np.dtype(entry["dtype"]).newbyteorder("<")) if entry["offsets"][-1] else None
    return (np.zeros(0, entry["dtype"]) if data is None else data), entry["offsets"]


def _merge_h5(out: Path, units: list[dict[str, Any]], keys: list[str]) -> Path:
    """--format h5: the units' records in plan order, a dataset per record (records_h5), in a temp file."""
    from tokenloom.formats.keyed.h5 import h5py_module
    from tokenloom.formats.keyed.records_h5 import segment_name

    tmp = temp_path(out / MERGED_H5)
    with h5py_module().File(tmp, "w") as handle:
        for key in keys:
            group, number, dtype = handle.create_group(key), 0, None
            for u, unit in enumerate(units):
                data, offsets = _unit_key(out, u, unit, key, dtype)
                dtype = dtype or unit["meta"].get(key, {}).get("dtype")
                for j in range(len(offsets) - 1):
                    group.create_dataset(segment_name(number), data=data[offsets[j] : offsets[j + 1]])
                    number += 1
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    return tmp


def record_summary(out: Path, sidecar: dict[str, Any] | None, counts: dict[str, Any], units: int) -> TokenizeSummary:
    """The summary of a --train-type run: the store's counts once published, else this node's."""
    stats = sidecar["stats"] if sidecar is not None else counts
    summary = TokenizeSummary(output_dir=out, format=record_format_at(out))
    summary.documents = stats.get("records", 0)
    summary.tokens = summary.run_tokens = stats.get("tokens", 0)
    skipped = dict(stats.get("errors", {}))
    if stats.get("skipped_too_long"):
        skipped["too_long"] = stats["skipped_too_long"]
    summary.skipped = skipped
    summary.post_training = {**stats, "train_type": sidecar["train_type"]} if sidecar else dict(stats)
    summary.units_committed = units
    return summary
