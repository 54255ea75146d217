"""A unit-planned run into object storage: many nodes write one dataset under a URL, byte-identical to one process.

    node R of N: CACHE/uploads/<URL>/<run key + node>/ is this node's staging directory
      -> the URL's plan object fetched (if any) and compared; created once (If-None-Match: *) otherwise
      -> the URL's node-count object the same way: another --num-nodes is a ConfigError naming both
      -> the URL's done markers of this node's units fetched: those units are skipped (a rerun on any machine)
      -> its other units encoded into the staging directory as on a shared disk (one unit at a time)
      -> a thread uploads each committed unit: its shards, then its done marker (an atomic create)
      -> its finished marker: when every node's is there, a unit still missing is named (taken by no node)
    every node at the end (or ``--finalize``): when every unit's done marker is at the URL, the done markers are
      fetched, the manifest is built from them (shard sizes checked against the listing) and uploaded last;
      the node records are deleted then
    --executor ray: the driver establishes the plan and skips committed units as a node does; each other unit is a
      Ray task that stages, uploads and commits it on its own machine (_ray); the driver then finalizes

A unit's bytes depend only on its input and the settings, so two nodes that both upload a unit put identical
objects, and two finalizers put identical manifests. A reader sees no dataset until the manifest lands.
RemoteDataset (one dataset at a URL) and UnitUploads (the upload thread) are what _remote_tree uses for each
dataset of a --layout tree / --val-fraction run.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import orjson

from tokenloom.formats import ConfigError, DataError, Manifest, ResumeMismatchError
from tokenloom.formats.io import MANIFEST_NAME
from tokenloom.formats.io.manifest import file_checksum
from tokenloom.formats.io.urls import parse_url
from tokenloom.formats.remote import helper
from tokenloom.formats.remote.client import ObjectInfo
from tokenloom.formats.remote.publish import RemoteTarget, staging_dir
from tokenloom.tokenize._config import ExecutorKind, TokenizeConfig
from tokenloom.tokenize._diff import run_key_differences
from tokenloom.tokenize._plan import RunInputs
from tokenloom.tokenize._ray import encode_with_ray, preflight
from tokenloom.tokenize._remote_output import UploadPoller
from tokenloom.tokenize._summary import ProgressCallback, TokenizeSummary
from tokenloom.tokenize._unit_files import (
    NODES_NAME,
    PLAN_NAME,
    UnitPlan,
    check_nodes,
    done_path,
    establish_plan,
    finished_path,
    is_node_record,
    is_unit_file,
    nodes_payload,
    read_done,
)
from tokenloom.tokenize._unit_upload import local_config, upload_unit
from tokenloom.tokenize._unit_work import Session, dealt_nodes, encode_local, rerun_hint
from tokenloom.tokenize._units import (
    _partial_summary,
    plan_of,
    prepare_units_dir,
    summary_of,
    write_unit_manifest,
)

__all__ = ["RemoteDataset", "UnitUploads", "run_units_to_url"]

log = logging.getLogger("tokenloom.tokenize")


def run_units_to_url(
    config: TokenizeConfig, inputs: RunInputs, on_progress: ProgressCallback | None = None
) -> TokenizeSummary:
    """This node's share of a unit-planned run whose output is ``config.output_url`` (see the module docstring)."""
    started = time.perf_counter()
    if config.output_url is None:
        raise ConfigError("run_units_to_url needs an object-store output_dir", field="output_dir")
    url = parse_url(config.output_url)
    plan = plan_of(config, inputs)
    num_nodes = config.num_nodes or 1
    key = {**plan.run_key, "node": [num_nodes, config.node_rank]}
    staging = staging_dir(url, key, config.cache_dir)
    dataset = RemoteDataset(RemoteTarget(url, config.storage_options), staging, plan)
    manifest = dataset.complete()
    if manifest is not None:
        summary = summary_of(manifest, Path(), time.perf_counter() - started)
        summary.output_dir = str(url)  # type: ignore[assignment]
        summary.already_complete = True
        return summary
    dataset.check_foreign()
    ray = config.executor is ExecutorKind.RAY and not config.finalize
    if ray:
        preflight(config)  # an unreachable cluster fails before anything is put at the URL
    staging.parent.mkdir(parents=True, exist_ok=True)
    local = local_config(config, staging)
    prepare_units_dir(local)
    dataset.establish_plan()
    recorded = dataset.establish_nodes(dealt_nodes(config))
    session = Session()
    if ray:  # each task stages, uploads and commits its unit on its own machine
        pending = [u for u in range(len(plan.units)) if done_path(staging, u).name not in dataset.listed]
        session = encode_with_ray(config, inputs, plan, on_progress, units=pending)
    elif not config.finalize:
        mine = [u for u in range(len(plan.units)) if u % num_nodes == config.node_rank]
        dataset.sync_markers(mine)
        uploads = UnitUploads([[(dataset, unit)] for unit in mine])
        uploads.start()
        try:
            session = encode_local(local, inputs, plan, on_progress)
        finally:
            uploads.stop()
        uploads.sweep()  # whatever committed after the thread's last look
        dataset.mark_finished(config.node_rank)
    everyone = not config.finalize and not ray and recorded is not None and dataset.all_finished(recorded)
    manifest = dataset.finalize(
        inputs.tokenizer, required=config.finalize or everyone, num_nodes=recorded, everyone=everyone
    )
    seconds = time.perf_counter() - started
    if manifest is None:
        summary = _partial_summary(staging, plan, session, seconds)
        summary.units_missing = dataset.missing()
    else:
        summary = summary_of(manifest, staging, seconds)
        shutil.rmtree(staging, ignore_errors=True)
    summary.output_dir = str(url)  # type: ignore[assignment]
    summary.examples = session.examples
    summary.run_tokens = session.tokens
    summary.bytes_read = session.bytes_read
    summary.text_bytes = session.text_bytes
    summary.units_committed = session.units
    return summary


class RemoteDataset:
    """One unit-planned dataset at a URL and its staging directory on this node (plan, done markers, manifest)."""

    def __init__(self, target: RemoteTarget, staging: Path, plan: UnitPlan) -> None:
        self.target = target
        self.staging = staging
        self.plan = plan
        self.listed = _listing(target)
        """The objects directly under the URL when this node started (markers, plan, shards, manifest)."""

    def complete(self) -> Manifest | None:
        """The URL's manifest when it was written with this plan's run key; another run's is a mismatch."""
        if MANIFEST_NAME not in self.listed:
            return None
        manifest = self.target.read_manifest()
        recorded = manifest.metadata.get("tokenize", {}) if manifest else {}
        if manifest is None or {k: recorded.get(k) for k in self.plan.run_key} != self.plan.run_key:
            raise ResumeMismatchError(
                f"{self.target.url} holds a dataset written with other settings, tokenizer, inputs or layout: "
                + "; ".join(run_key_differences(recorded, self.plan.run_key)),
                path=str(self.target.url),
                hint="Choose another --output-dir, or delete the prefix and rerun every node",
            )
        return manifest

    def check_foreign(self) -> None:
        """ConfigError when the URL holds objects no unit-planned run wrote (before anything is put there)."""
        foreign = sorted(name for name in self.listed if not is_unit_file(name) and name != MANIFEST_NAME)
        if foreign:
            raise ConfigError(
                f"{self.target.url} holds objects that no unit-planned tokenize run wrote: {', '.join(foreign[:5])}",
                path=str(self.target.url),
                field="output_dir",
                hint="Choose an empty prefix for --output-dir",
            )

    def establish_plan(self) -> None:
        """The URL's plan is this plan: fetched and compared, or created once (another node may race us)."""
        _establish_plan(self.target, self.staging, self.plan, self.listed)

    def establish_nodes(self, num_nodes: int | None) -> int | None:
        """The run's node count at the URL: put once (the first node), or fetched and checked (a ConfigError
        naming both counts); None when nothing is recorded and ``num_nodes`` is None (--finalize alone)."""
        local = self.staging / NODES_NAME
        if NODES_NAME in self.listed:
            there = self.listed[NODES_NAME]
        elif num_nodes is None:
            return None
        else:
            local.write_bytes(nodes_payload(self.plan, num_nodes))
            if helper.put_once(self.target.config, local, NODES_NAME, file_checksum(local)):
                return num_nodes
            there = _listing(self.target)[NODES_NAME]  # another node put it first: its count must be ours
        return check_nodes(_fetch(self.target, there, local), num_nodes, self.target.url.url(NODES_NAME))

    def mark_finished(self, rank: int) -> None:
        """Node ``rank`` has committed its every unit at the URL (the last node knows it is last)."""
        marker = finished_path(self.staging, rank)
        marker.write_bytes(b"")
        self.target.upload(marker)

    def all_finished(self, num_nodes: int) -> bool:
        listed = _listing(self.target)
        return all(finished_path(self.staging, rank).name in listed for rank in range(num_nodes))

    def sync_markers(self, units: list[int]) -> None:
        """Staged done markers of ``units`` agree with the URL: a unit committed there is skipped here (fetched
        marker), and a staged marker whose shards were uploaded but whose URL marker is gone is encoded again."""
        for unit in units:
            marker = done_path(self.staging, unit)
            if marker.name in self.listed and not marker.exists():
                _fetch(self.target, self.listed[marker.name], marker)
            elif marker.name in self.listed or not marker.exists():
                continue
            elif not _staged_whole(self.staging, unit, self.plan):
                marker.unlink()  # the URL lost its marker, and its staged shards are gone (uploaded): encode it again

    def missing(self) -> int:
        """Units not committed at the URL now."""
        return len(_missing(self.plan, _listing(self.target)))

    def finalize(
        self, tokenizer: str, *, required: bool, first: int = 0, num_nodes: int | None = None, everyone: bool = False
    ) -> Manifest | None:
        """The manifest, uploaded once every unit is committed at the URL; None (or, if ``required``, an error).

        ``first``, ``num_nodes``: how the units were dealt to nodes, for the error's list of nodes to rerun.
        ``everyone``: every node has finished, so a unit still missing was taken by no node (said as such).
        """
        dealt = (first, num_nodes)
        return _finalize(
            self.target, self.staging, self.plan, tokenizer, required=required, dealt=dealt, everyone=everyone
        )


def _listing(target: RemoteTarget) -> dict[str, ObjectInfo]:
    """The objects directly under the output prefix, by name (a missing bucket is a named error)."""
    base = f"{target.url.prefix}/" if target.url.prefix else ""
    try:
        objects = helper.list_objects(target.config)
    except DataError:
        helper.check_bucket(target.config)
        raise
    found = {}
    for obj in objects:
        name = obj.key[len(base) :]
        if "/" not in name:
            found[name] = obj
    return found


def _fetch(target: RemoteTarget, obj: ObjectInfo, path: Path) -> bytes:
    """A small object (plan, done marker) fetched whole into ``path`` (replaced atomically); its bytes."""
    tmp = path.with_name(f".{path.name}.fetch-{time.monotonic_ns()}.tmp")
    try:
        helper.fetch_into(target.config, obj, 0, obj.size, tmp)
        data = tmp.read_bytes()
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return data


_PLAN_HINT = (
    "Every node must run the same command on the same inputs: restore a changed input, or write into another "
    "--output-dir prefix (or delete this prefix and rerun every node) to start afresh"
)


def _establish_plan(target: RemoteTarget, staging: Path, plan: UnitPlan, listed: dict[str, ObjectInfo]) -> None:
    """The URL's plan is this plan: fetched and compared, or created once (another node may race us)."""
    local_plan = staging / PLAN_NAME
    if PLAN_NAME in listed:  # even over a staged one: the prefix may have been emptied and reused by another run
        _fetch(target, listed[PLAN_NAME], local_plan)
    try:
        establish_plan(staging, plan)  # a different recorded plan is a ResumeMismatchError naming what differs
    except ResumeMismatchError as error:  # named at the URL (the staged copy is this node's cache), no --overwrite
        raise ResumeMismatchError(
            f"{target.url}'s unit plan was made with other settings, tokenizer or inputs: "
            + error.problem.split(": ", 1)[-1],
            path=target.url.url(PLAN_NAME),
            hint=_PLAN_HINT,
        ) from None
    if PLAN_NAME in listed:
        return
    if helper.put_once(target.config, local_plan, PLAN_NAME, file_checksum(local_plan)):
        return
    there = _listing(target)[PLAN_NAME]  # another node created it first: it must be the same plan
    other = staging / f"{PLAN_NAME}.theirs"
    if _fetch(target, there, other) != local_plan.read_bytes():
        theirs = orjson.loads(other.read_bytes()).get("run_key", {})
        raise ResumeMismatchError(
            f"{target.url}'s unit plan was made with other settings, tokenizer or inputs: "
            + "; ".join(run_key_differences(theirs, plan.run_key)),
            path=target.url.url(PLAN_NAME),
            hint=_PLAN_HINT,
        )
    other.unlink(missing_ok=True)


class UnitUploads(UploadPoller):
    """Uploads each unit once committed: shards first, the done marker last.

    ``groups``: units committed together, in the order their markers must reach the URL (a leaf carved by
    --val-fraction: its val dataset's unit, then its train dataset's), so that a train marker at the URL
    always means the val part is there too; a group goes up only as far as its members are committed.
    """

    name = "tokenloom-unit-uploads"

    def __init__(self, groups: list[list[tuple[RemoteDataset, int]]]) -> None:
        super().__init__()
        waiting = ([(d, u) for d, u in group if done_path(d.staging, u).name not in d.listed] for group in groups)
        self.pending = [group for group in waiting if group]

    def sweep(self) -> None:
        if self.error is not None:
            raise self.error
        self._upload_committed()

    def _upload_committed(self) -> None:
        for group in list(self.pending):
            while group and done_path(group[0][0].staging, group[0][1]).exists():
                dataset, unit = group[0]
                upload_unit(dataset.target, dataset.staging, unit)
                group.pop(0)
            if not group:
                self.pending.remove(group)


def _staged_whole(staging: Path, unit: int, plan: UnitPlan) -> bool:
    """True when the unit's staged done marker still has its shard files beside it (to upload)."""
    try:
        read_done(staging, unit, plan.digest)
    except DataError:
        return False
    return True


def _missing(plan: UnitPlan, listed: dict[str, ObjectInfo]) -> list[int]:
    return [u for u in range(len(plan.units)) if done_path(Path(), u).name not in listed]


def _finalize(
    target: RemoteTarget,
    staging: Path,
    plan: UnitPlan,
    tokenizer: str,
    *,
    required: bool,
    dealt: tuple[int, int | None] = (0, None),
    everyone: bool = False,
) -> Manifest | None:
    """Upload the manifest once every unit is committed at the URL; None (or, if ``required``, an error) otherwise."""
    listed = _listing(target)
    missing = _missing(plan, listed)
    if missing:
        if not required:
            log.info("%s: %d unit(s) not committed yet; the last node (or --finalize) writes the manifest", target.url,
                     len(missing))  # fmt: skip
            return None
        shown = ", ".join(f"{u} ({plan.units[u].label})" for u in missing[:10])
        why = (
            f"every node of --num-nodes {dealt[1]} has finished, yet {len(missing)} of {len(plan.units)} units "
            f"were taken by no node at {target.url}: {shown}"
            if everyone
            else f"{len(missing)} of {len(plan.units)} units are not committed at {target.url} yet: {shown}"
        )
        raise DataError(
            why + (" ..." if len(missing) > 10 else ""),
            path=str(target.url),
            hint=rerun_hint(missing, *dealt),
        )
    for unit in range(len(plan.units)):
        marker = done_path(staging, unit)
        if not marker.exists():
            _fetch(target, listed[marker.name], marker)
    sizes = {name: obj.size for name, obj in listed.items()}
    manifest = write_unit_manifest(staging, plan, tokenizer, sizes)
    target.upload(staging / MANIFEST_NAME)  # last: now the dataset exists at the URL
    for name in listed:  # the dataset's objects do not depend on how many nodes wrote it
        if is_node_record(name):
            target.delete(name)
    log.info("%s: manifest uploaded (%d units)", target.url, len(plan.units))
    return manifest
