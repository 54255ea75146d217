"""Where a unit-planned run's committed units go: a local OUT, or a bucket prefix, each unit uploaded as it commits.

    the one unit pipeline (_units: one dataset; _tree: a dataset per leaf) writes unit u into the dataset's
    directory (OUT, or OUT's staging copy on this node: CACHE/uploads/<URL>/<run key + node>/[<split>/<bucket>])
      -> on_commit(directory, u), i.e. publisher.commit_unit:
           local OUT:  nothing more, the done marker's atomic create in OUT was the commit (commit_unit=None)
           a bucket:   BucketPublisher queues it; one thread uploads, in commit order, the unit's shards, then its
                       done marker (If-None-Match: the unit's commit at the URL), then removes the staged shards
      -> BucketDataset.finish: every unit's marker at the URL -> the manifest from them, uploaded last; the
         node records (.tokenloom-nodes.json, finished markers) deleted
    publish_to_url: a run into a bucket (one process is --num-nodes 1; Ray tasks upload their own units):
      -> each dataset's manifest with this plan: complete; another's: refused (one process: --overwrite deletes
         the manifest first, then the prefix's other tokenize objects)
      -> its plan and node count: fetched and compared, or created once (If-None-Match: *)
      -> this node's units committed at the URL: skipped; staged whole but not at the URL: uploaded first
      -> its finished marker; the last node (or --finalize) writes the manifest
    --train-type (a record store): a unit is its store (unit_UUUUUU_0000.records/ and its done marker), uploaded
    as it commits and kept staged; the last node fetches the stores other nodes staged, merges them in plan order
    with the local merge (_unit_records.publish_records, in its staging directory), uploads the merged store's
    data files, post_training.json, meta.json and manifest.json last, then deletes the unit objects at the URL

A unit's bytes depend only on its input and the settings, so two nodes that both upload a unit put identical
objects, and two finalizers put identical manifests. A reader sees no dataset until the manifest lands.
"""

from __future__ import annotations

import functools
import logging
import queue
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from tokenloom.formats import ConfigError, DataError, Manifest, ResumeMismatchError
from tokenloom.formats.io import MANIFEST_NAME, WRITING_MARKER, temp_base
from tokenloom.formats.io.manifest import file_checksum
from tokenloom.formats.io.urls import parse_url
from tokenloom.formats.keyed.bin_meta import META_NAME
from tokenloom.formats.keyed.records import POST_TRAINING_SIDECAR
from tokenloom.formats.remote import helper
from tokenloom.formats.remote.client import ObjectInfo
from tokenloom.formats.remote.publish import RemoteTarget, native_files, staging_dir
from tokenloom.tokenize._config import ExecutorKind, TokenizeConfig
from tokenloom.tokenize._diff import run_key_differences
from tokenloom.tokenize._plan import RunInputs, check_tokenizer_files
from tokenloom.tokenize._ray import encode_with_ray, local_config, preflight
from tokenloom.tokenize._summary import ProgressCallback, TokenizeSummary
from tokenloom.tokenize._tree import TreeDataset, encode_tree, first_units, tree_datasets, tree_summary
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
    uncommitted_error,
    unit_stem,
)
from tokenloom.tokenize._unit_records import (
    UNIT_META,
    RecordStore,
    encode_records,
    is_record_store_file,
    merged,
    publish_records,
    record_summary,
    records_complete,
    unit_store,
)
from tokenloom.tokenize._unit_work import Session, dealt_nodes, encode_local, node_units, rerun_hint
from tokenloom.tokenize._units import _partial_summary, plan_of, prepare_units_dir, summary_of, write_unit_manifest

__all__ = ["BucketDataset", "BucketPublisher", "publish_to_url", "upload_unit"]

log = logging.getLogger("tokenloom.tokenize")


def publish_to_url(
    config: TokenizeConfig, inputs: RunInputs, on_progress: ProgressCallback | None = None
) -> TokenizeSummary:
    """This node's share of a run whose output is ``config.output_url`` (see the module docstring)."""
    started = time.perf_counter()
    if config.output_url is None:
        raise ConfigError("publish_to_url needs an object-store output_dir", field="output_dir")
    if Path(inputs.tokenizer).is_dir():  # damaged tokenizer files: a ConfigError before anything is put
        check_tokenizer_files(Path(inputs.tokenizer))
    if config.train_type is not None:
        RecordStore(config, inputs.tokenizer).check()  # a tokenizer without a chat template: before any put
    with BucketPublisher(config) as publisher:
        per_leaf, datasets = publisher.datasets(inputs)
        if config.overwrite:  # the old dataset goes, its manifest first
            datasets[0].clear()
        alone = config.num_nodes is None and not (config.finalize or per_leaf or config.executor is ExecutorKind.RAY)
        for dataset in datasets:
            dataset.manifest = dataset.complete(overwrite_hint=alone)  # --overwrite: one process only (_config)
        if all(d.manifest is not None for d in datasets):
            return _summary(config, publisher.root, per_leaf, datasets, Session(), started, already_complete=True)
        for dataset in datasets:  # before anything is put under the URL
            if dataset.manifest is None and not config.overwrite:
                dataset.check_foreign()
        ray = config.executor is ExecutorKind.RAY and not config.finalize
        if ray:
            preflight(config)  # an unreachable cluster fails before anything is put at the URL
        recorded: int | None = None
        for dataset in datasets:
            prepare_units_dir(local_config(config, dataset.staging))
            if dataset.manifest is None:
                dataset.establish_plan()
                recorded = dataset.establish_nodes(dealt_nodes(config))
        local = local_config(config, publisher.root)
        session = Session()
        if ray:  # each task stages, uploads and commits its unit on its own machine
            (only,) = datasets
            pending = [u for u in range(len(only.plan.units)) if not only.at_url(u)]
            if only.records is not None:  # the last step below merges the stores, as the last node does
                session = encode_records(
                    config, inputs.tokenizer, only.plan, on_progress, units=pending, upload=only.upload
                )
            else:
                session = encode_with_ray(config, inputs, only.plan, on_progress, units=pending, upload=only.upload)
        elif not config.finalize:
            publisher.sync()
            if datasets[0].records is not None:
                session = encode_records(
                    local, inputs.tokenizer, datasets[0].plan, on_progress, on_commit=publisher.commit_unit
                )
            elif per_leaf:
                session = encode_tree(local, inputs, per_leaf, on_progress, on_commit=publisher.commit_unit)
            else:
                session = encode_local(local, inputs, datasets[0].plan, on_progress, on_commit=publisher.commit_unit)
            publisher.drain()  # every unit committed here is at the URL now
            if not per_leaf:
                datasets[0].mark_finished(config.node_rank)
        single = not (config.finalize or ray or per_leaf)
        everyone = single and recorded is not None and datasets[0].all_finished(recorded)
        for dataset in datasets:
            dataset.manifest = dataset.manifest or dataset.finish(
                inputs.tokenizer,
                required=config.finalize or everyone,
                num_nodes=config.num_nodes if per_leaf else recorded,
                everyone=everyone,
            )
        summary = _summary(config, publisher.root, per_leaf, datasets, session, started)
        if all(d.manifest is not None for d in datasets):
            shutil.rmtree(publisher.root, ignore_errors=True)
    return summary


def _summary(
    config: TokenizeConfig,
    root: Path,
    per_leaf: list[list[TreeDataset]],
    datasets: list[BucketDataset],
    session: Session,
    started: float,
    *,
    already_complete: bool = False,
) -> TokenizeSummary:
    """One summary over the datasets' manifests; while some are not published, what this node encoded."""
    seconds = time.perf_counter() - started
    manifests = [d.manifest for d in datasets if d.manifest is not None]
    unfinished = [d for d in datasets if d.manifest is None]
    if per_leaf:
        summary = tree_summary(local_config(config, root), manifests, seconds, session)  # pyright: ignore[reportArgumentType]
        summary.datasets = sorted(t.name for ts in per_leaf for t in ts)
        if unfinished:
            summary.units_total = sum(len(d.plan.units) for d in unfinished)
            summary.documents = session.counts.documents
    elif datasets[0].records is not None:
        published = manifests[0] if manifests else None
        summary = record_summary(root, published, session.records, session.units)  # pyright: ignore[reportArgumentType]
        summary.seconds = seconds
        if published is None:
            summary.units_total = len(datasets[0].plan.units)
    elif manifests:
        summary = summary_of(manifests[0], root, seconds)  # pyright: ignore[reportArgumentType]
    else:
        summary = _partial_summary(root, datasets[0].plan, session, seconds)
    if unfinished:
        summary.units_missing = sum(d.missing() for d in unfinished)
    summary.output_dir = config.output_url  # type: ignore[assignment]
    summary.already_complete = already_complete
    summary.add_session(session)
    return summary


class BucketPublisher:
    """The datasets of a run at their URLs, and the one thread that uploads each unit as it commits (in order).

    ``options``: the store options every target of the run is built with (one place, one value).
    """

    def __init__(self, config: TokenizeConfig) -> None:
        self.config = config
        self.url = parse_url(str(config.output_url))
        self.options = config.remote
        self.root = Path()
        self.groups: list[list[BucketDataset]] = []
        """The datasets by leaf (a tree) or the one dataset: ``[train]`` or ``[train, val]``."""
        self._by_dir: dict[Path, BucketDataset] = {}
        self.error: BaseException | None = None
        self._queue: queue.Queue[tuple[BucketDataset, int] | None] = queue.Queue()
        self._failed: list[tuple[BucketDataset, int]] = []
        self._thread = threading.Thread(target=self._run, name="tokenloom-unit-uploads", daemon=True)

    def datasets(self, inputs: RunInputs) -> tuple[list[list[TreeDataset]], list[BucketDataset]]:
        """The run's datasets, each staged under this node's staging root (a tree: one per leaf and role)."""
        config = self.config
        key: dict[str, Any] = {"node": [config.num_nodes or 1, config.node_rank]}
        if not config.many_datasets:
            plan = plan_of(config, inputs)
            self.root = staging_dir(self.url, {**plan.run_key, **key}, config.plan_cache_dir)
            records = local_config(config, self.root) if config.train_type is not None else None
            self.groups = [[BucketDataset(RemoteTarget(self.url, self.options), self.root, plan, records=records)]]
            self._by_dir = {self.root: self.groups[0][0]}
            return [], self.groups[0]
        key.update(inputs.run_key(config), layout=config.layout.value, unit_bytes=config.unit_bytes)
        self.root = staging_dir(self.url, key, config.plan_cache_dir)
        per_leaf = tree_datasets(config, inputs, self.root)
        for targets, first in zip(per_leaf, first_units(per_leaf), strict=True):
            self.groups.append([self._tree_dataset(target, first) for target in targets])
        return per_leaf, list(self._by_dir.values())

    def _tree_dataset(self, target: TreeDataset, first: int) -> BucketDataset:
        out = target.config.output_dir
        url = parse_url(f"{str(self.url).rstrip('/')}/{out.relative_to(self.root).as_posix()}")
        self._by_dir[out] = BucketDataset(RemoteTarget(url, self.options), out, target.plan, first)
        return self._by_dir[out]

    def sync(self) -> None:
        """This node's staged done markers as the URLs have them; what is staged but not at a URL is queued.

        A leaf's unit is skipped (pending_units looks at its first dataset's staged marker) only when every
        dataset of the leaf has it: otherwise every staged marker of it is removed, so the unit is encoded again.
        """
        for group in self.groups:
            mine = node_units(self.config, len(group[0].plan.units), group[0].first)
            for dataset in group:
                dataset.sync_markers(mine)
            for unit in mine:
                markers = [done_path(dataset.staging, unit) for dataset in group]
                if not all(marker.exists() for marker in markers):
                    # a leaf's unit lacking a part (a val marker without its train one, after a kill between the
                    # two commits) is encoded again whole: none of its parts is queued here, or the re-encoded
                    # part would be queued twice and the first upload would remove the second one's shards
                    for marker in markers:
                        marker.unlink(missing_ok=True)
                    continue
                for dataset in reversed(group):  # val before train: a train marker at the URL means val is there
                    if done_path(dataset.staging, unit).exists() and not dataset.at_url(unit):
                        self._queue.put((dataset, unit))

    def commit_unit(self, out: Path, unit: int) -> None:
        """Unit ``unit`` of the dataset staged in ``out`` is committed there: queued for its upload."""
        self._queue.put((self._by_dir[out], unit))

    def drain(self) -> None:
        """Wait until every queued unit is at its URL; an upload that failed is retried here (or raises)."""
        self._queue.put(None)
        self._thread.join()
        failed, self._failed = self._failed, []
        for dataset, unit in failed:
            upload_unit(dataset.target, dataset.staging, unit)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self.error is not None:  # after a failure the rest waits for drain(), in order
                self._failed.append(item)
                continue
            try:
                upload_unit(item[0].target, item[0].staging, item[1])
            except BaseException as exc:
                self.error = exc
                self._failed.append(item)
                log.warning("uploading a committed unit failed (retried after the run): %s", exc)

    def __enter__(self) -> BucketPublisher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread.is_alive():  # an error: what was committed still goes up, the error is the caller's
            self._queue.put(None)
            self._thread.join()


class BucketDataset:
    """One unit-planned dataset at a URL and its staging directory on this node (plan, done markers, manifest)."""

    def __init__(
        self, target: RemoteTarget, staging: Path, plan: UnitPlan, first: int = 0, records: TokenizeConfig | None = None
    ) -> None:
        self.target = target
        self.staging = staging
        self.plan = plan
        self.first = first
        """Where its units start in the count a tree deals to nodes (0 for one dataset)."""
        self.records = records
        """--train-type: the run's config writing into ``staging`` (a record store); None: token shards."""
        self.manifest: Manifest | dict[str, Any] | None = None
        """What is published at the URL: the manifest, or a record store's post_training.json sidecar."""
        self.listed = _listing(target)
        """The objects directly under the URL when this node started (markers, plan, shards, manifest)."""
        self.upload = functools.partial(upload_unit, target)
        """``upload(staging, unit)``: a unit staged elsewhere (a Ray task's machine) into this dataset."""

    def at_url(self, unit: int) -> bool:
        return done_path(self.staging, unit).name in self.listed

    def complete(self, *, overwrite_hint: bool = False) -> Manifest | dict[str, Any] | None:
        """The URL's manifest when it was written with this plan's run key; another run's is a mismatch."""
        if MANIFEST_NAME not in self.listed:
            return None
        if self.records is not None:
            return self._records_complete(overwrite_hint=overwrite_hint)
        manifest = self.target.read_manifest()
        recorded = manifest.metadata.get("tokenize", {}) if manifest else {}
        if manifest is None or {k: recorded.get(k) for k in self.plan.run_key} != self.plan.run_key:
            raise ResumeMismatchError(
                f"{self.target.url} holds a dataset written with other settings, tokenizer, inputs or layout: "
                + "; ".join(run_key_differences(recorded, self.plan.run_key)),
                path=str(self.target.url),
                hint="Pass --overwrite to replace it, or choose another --output-dir"
                if overwrite_hint
                else "Choose another --output-dir, or delete the prefix and rerun every node",
            )
        return manifest

    def check_foreign(self) -> None:
        """ConfigError when the URL holds objects no tokenize run wrote (before anything is put there)."""
        ours = is_record_store_file if self.records is not None else (lambda name: name == MANIFEST_NAME)
        foreign = sorted(name for name in self.listed if not (is_unit_file(name) or ours(name)))
        if foreign:
            raise ConfigError(
                f"{self.target.url} holds objects that are not a tokenize output: {', '.join(foreign[:5])}",
                path=str(self.target.url),
                field="output_dir",
                hint="Choose an empty prefix, or pass --overwrite (it replaces the dataset, other objects stay)",
            )

    def clear(self) -> None:
        """--overwrite (one process): the manifest first (no reader pairs it with new shards), then the rest of
        every tokenize output under the prefix; other objects stay. The staged copy is started afresh too."""
        if MANIFEST_NAME in self.listed:
            self.target.delete(MANIFEST_NAME)
        ours = is_record_store_file if self.records is not None else native_files
        for name in self.listed:
            if name != MANIFEST_NAME and (is_unit_file(name) or ours(name)):
                self.target.delete(name)
        self._delete_unit_stores()
        shutil.rmtree(self.staging, ignore_errors=True)
        self.listed = _listing(self.target)

    def establish_plan(self) -> None:
        """The URL's plan is this plan: fetched and compared, or created once (another node may race us)."""
        local_plan = self.staging / PLAN_NAME
        if PLAN_NAME in self.listed:  # even over a staged one: the prefix may have been emptied and reused
            _fetch(self.target, self.listed[PLAN_NAME], local_plan)
        try:
            establish_plan(self.staging, self.plan)  # another recorded plan: a ResumeMismatchError naming it
        except ResumeMismatchError as error:  # named at the URL (the staged copy is this node's cache)
            raise _plan_mismatch(self.target, error.problem.split(": ", 1)[-1]) from None
        if PLAN_NAME in self.listed or helper.put_once(
            self.target.config, local_plan, PLAN_NAME, file_checksum(local_plan)
        ):
            return
        other = self.staging / f"{PLAN_NAME}.theirs"  # another node created it first: it must be the same plan
        if _fetch(self.target, _listing(self.target)[PLAN_NAME], other) != local_plan.read_bytes():
            theirs = orjson.loads(other.read_bytes()).get("run_key", {})
            raise _plan_mismatch(self.target, "; ".join(run_key_differences(theirs, self.plan.run_key)))
        other.unlink(missing_ok=True)

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

    def sync_markers(self, units: list[int]) -> None:
        """Staged done markers of ``units`` agree with the URL: a unit committed there is skipped here (fetched
        marker), and a staged marker whose shards were uploaded but whose URL marker is gone is encoded again."""
        for unit in units:
            marker = done_path(self.staging, unit)
            if marker.name in self.listed and not marker.exists():
                _fetch(self.target, self.listed[marker.name], marker)
            elif marker.name in self.listed or not marker.exists():
                continue
            else:
                if not self._staged_whole(unit):
                    marker.unlink()  # the URL lost its marker, and the staged shards are gone: encode it again

    def _staged_whole(self, unit: int) -> bool:
        """A unit committed here still has its shards (or record store) staged beside its marker: uploadable."""
        if self.records is not None:
            return (unit_store(self.staging, unit) / UNIT_META).is_file()
        try:
            read_done(self.staging, unit, self.plan.digest)
        except DataError:
            return False
        return True

    def mark_finished(self, rank: int) -> None:
        """Node ``rank`` has committed its every unit at the URL (the last node knows it is last)."""
        marker = finished_path(self.staging, rank)
        marker.write_bytes(b"")
        self.target.upload(marker)

    def all_finished(self, num_nodes: int) -> bool:
        listed = _listing(self.target)
        return all(finished_path(self.staging, rank).name in listed for rank in range(num_nodes))

    def missing(self) -> int:
        """Units not committed at the URL now."""
        return len(_missing(self.plan, _listing(self.target)))

    def finish(
        self, tokenizer: str, *, required: bool, num_nodes: int | None = None, everyone: bool = False
    ) -> Manifest | dict[str, Any] | None:
        """The manifest (a record store: its sidecar), uploaded last once every unit is at the URL; None (or an error).

        ``num_nodes``: how the units were dealt, for the error's list of nodes to rerun. ``everyone``: every node
        has finished, so a unit still missing was taken by no node (said as such).
        """
        listed = _listing(self.target)
        missing = _missing(self.plan, listed)
        units = len(self.plan.units)
        if missing and not required:
            log.info("%s: %d unit(s) not committed yet; the last node (or --finalize) writes the manifest",
                     self.target.url, len(missing))  # fmt: skip
            if self.records is not None:  # the last node fetches what it lacks: no second copy kept here
                for unit in range(units):
                    if done_path(self.staging, unit).name in listed:
                        shutil.rmtree(unit_store(self.staging, unit), ignore_errors=True)
            return None
        if missing:
            url, hint = self.target.url, rerun_hint(missing, self.first, num_nodes)
            raise uncommitted_error(
                self.plan, missing, path=str(url), num_nodes=num_nodes, everyone=everyone, hint=hint, where=f" at {url}"
            )
        if self.records is not None:
            return self._publish_records(tokenizer, listed)
        for unit in range(units):
            marker = done_path(self.staging, unit)
            if not marker.exists():
                _fetch(self.target, listed[marker.name], marker)
        manifest = write_unit_manifest(self.staging, self.plan, tokenizer, {n: o.size for n, o in listed.items()})
        self.target.upload(self.staging / MANIFEST_NAME)  # last: now the dataset exists at the URL
        for name in listed:  # the dataset's objects do not depend on how many nodes wrote it
            if is_node_record(name):
                self.target.delete(name)
        log.info("%s: manifest uploaded (%d units)", self.target.url, units)
        return manifest

    def _records_complete(self, *, overwrite_hint: bool) -> dict[str, Any] | None:
        """A record store at the URL: its sidecar when the URL's plan is this plan (as records_complete locally);
        unit objects a killed publish left behind are deleted."""
        staged = self.staging / ".published"
        staged.mkdir(parents=True, exist_ok=True)
        for name in (PLAN_NAME, META_NAME, POST_TRAINING_SIDECAR, MANIFEST_NAME):
            if name in self.listed:
                _fetch(self.target, self.listed[name], staged / name)
        try:
            sidecar = records_complete(staged, self.plan)
        except ResumeMismatchError as error:
            raise ResumeMismatchError(
                f"{self.target.url} holds a record store written with other settings, tokenizer or inputs: "
                + error.problem.split(": ", 1)[-1],
                path=str(self.target.url),
                hint=error.hint if overwrite_hint else "Choose another --output-dir, or delete the prefix and rerun",
            ) from None
        finally:
            shutil.rmtree(staged, ignore_errors=True)
        if sidecar is not None:
            self._delete_unit_stores(done_markers=True)
        return sidecar

    def _publish_records(self, tokenizer: str, listed: dict[str, ObjectInfo]) -> dict[str, Any]:
        """Every unit's store staged here (fetched when another node committed it), merged by publish_records,
        then uploaded: data files, sidecar, meta.json, manifest.json last; then the unit objects deleted."""
        config = self.records
        assert config is not None  # noqa: S101  (only called for a record store)
        if not merged(self.staging):  # a killed publish merged already: its unit stores may be gone
            try:
                self._fetch_unit_stores(listed)
            except DataError:  # another node finalized at the same time and deleted the unit objects
                if MANIFEST_NAME not in (listing := _listing(self.target)):
                    raise
                self.listed = listing
                return self._records_complete(overwrite_hint=False)  # pyright: ignore[reportReturnType]
        if not (self.staging / MANIFEST_NAME).is_file():  # unpublished until its manifest (publish_records)
            (self.staging / WRITING_MARKER).touch()
        sidecar = publish_records(self.staging, self.plan, config, tokenizer)
        last = (META_NAME, MANIFEST_NAME)
        names = sorted(p.name for p in self.staging.iterdir() if is_record_store_file(p.name) and p.name not in last)
        for name in [*names, *last]:  # manifest.json last: now the record store exists at the URL
            if (self.staging / name).is_file() and temp_base(name) == name:
                self.target.upload(self.staging / name)
        self._delete_unit_stores(done_markers=True)
        log.info("%s: record store uploaded (%d units)", self.target.url, len(self.plan.units))
        return sidecar

    def _fetch_unit_stores(self, listed: dict[str, ObjectInfo]) -> None:
        """Every unit's done marker and record store staged here: those other nodes committed are fetched."""
        stores = self._unit_store_objects()
        for unit in range(len(self.plan.units)):
            marker, store = done_path(self.staging, unit), unit_store(self.staging, unit)
            if not marker.exists():
                _fetch(self.target, listed[marker.name], marker)
            if (store / UNIT_META).is_file():
                continue
            shutil.rmtree(store, ignore_errors=True)  # fetched whole again; its unit-meta.json last
            store.mkdir(parents=True)
            for obj in sorted(stores.get(store.name, []), key=lambda o: o.key.endswith(UNIT_META)):
                _fetch(self.target, obj, store / obj.key.rsplit("/", 1)[-1])

    def _unit_store_objects(self) -> dict[str, list[ObjectInfo]]:
        """The objects of unit record stores under the URL (``unit_UUUUUU_0000.records/KEY``), by store name."""
        base = f"{self.target.url.prefix}/" if self.target.url.prefix else ""
        stores: dict[str, list[ObjectInfo]] = {}
        for obj in helper.list_objects(self.target.config):
            folder, _, rest = obj.key[len(base) :].partition("/")
            if rest and "/" not in rest and is_unit_file(folder):
                stores.setdefault(folder, []).append(obj)
        return stores

    def _delete_unit_stores(self, *, done_markers: bool = False) -> None:
        """The unit record stores at the URL (and, once published, the done markers and node records)."""
        base = f"{self.target.url.prefix}/" if self.target.url.prefix else ""
        for objects in self._unit_store_objects().values():
            for obj in objects:
                self.target.delete(obj.key[len(base) :])
        if done_markers:
            for name in _listing(self.target):
                if name != PLAN_NAME and is_unit_file(name):
                    self.target.delete(name)


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


def _missing(plan: UnitPlan, listed: dict[str, ObjectInfo]) -> list[int]:
    return [u for u in range(len(plan.units)) if done_path(Path(), u).name not in listed]


def _plan_mismatch(target: RemoteTarget, differences: str) -> ResumeMismatchError:
    return ResumeMismatchError(
        f"{target.url}'s unit plan was made with other settings, tokenizer or inputs: {differences}",
        path=target.url.url(PLAN_NAME),
        hint="Every node must run the same command on the same inputs: restore a changed input, or write into "
        "another --output-dir prefix (or delete this prefix and rerun every node) to start afresh",
    )


def upload_unit(target: RemoteTarget, staging: Path, unit: int) -> None:
    """A committed unit's shards, then its done marker (the unit's commit at the URL); then its staged shards go.

    The one way a unit reaches a bucket: a node's upload thread and a Ray task (on its own machine) call it.
    """
    marker = done_path(staging, unit)
    payload = orjson.loads(marker.read_bytes())
    if "shards" not in payload:  # a record unit: its store, kept staged (the last node merges the stores)
        store = unit_store(staging, unit)
        for path in sorted(store.iterdir(), key=lambda p: p.name == UNIT_META):
            target.upload(path, f"{store.name}/{path.name}")
        helper.put_once(target.config, marker, marker.name, file_checksum(marker))
        return
    records = payload["shards"]
    stems = [unit_stem(unit, int(record["index"])) for record in records]
    for stem, record in zip(stems, records, strict=True):
        target.upload(staging / f"{stem}.idx", checksum=str(record["idx_xxh3_128"]))
        target.upload(staging / f"{stem}.bin", checksum=str(record["bin_xxh3_128"]))
    helper.put_once(target.config, marker, marker.name, file_checksum(marker))
    for stem in stems:  # in the bucket now: the local marker alone tells a rerun here to skip the unit
        for suffix in (".bin", ".idx"):
            (staging / f"{stem}{suffix}").unlink(missing_ok=True)
