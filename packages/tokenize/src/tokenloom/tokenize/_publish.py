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
    as it commits and kept staged (a Ray task: uploaded from its machine's cache, then removed there); the last
    node (a Ray run's driver) fetches the stores it lacks, merges them in plan order with the local merge
    (_unit_records.publish_records, in its staging directory), uploads the merged store's data files (or
    data.h5), post_training.json, meta.json and manifest.json last, then deletes the unit objects at the URL

A unit's bytes depend only on its input and the settings, so two nodes that both upload a unit put identical
objects, and two finalizers put identical manifests. A reader sees no dataset until the manifest lands.
Here: the run and its upload thread; _bucket: a dataset at its URL (BucketDataset) and its objects.
"""

from __future__ import annotations

import logging
import queue
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from tokenloom.formats import ConfigError
from tokenloom.formats.io.urls import parse_url
from tokenloom.formats.remote.publish import RemoteTarget, staging_dir
from tokenloom.tokenize._bucket import BucketDataset, upload_unit
from tokenloom.tokenize._config import ExecutorKind, TokenizeConfig
from tokenloom.tokenize._plan import RunInputs, check_tokenizer_files
from tokenloom.tokenize._ray import local_config, preflight
from tokenloom.tokenize._summary import ProgressCallback, TokenizeSummary
from tokenloom.tokenize._tree import TreeDataset, datasets_of, first_units
from tokenloom.tokenize._unit_files import done_path
from tokenloom.tokenize._unit_work import Delivery, Session, UnitOutput
from tokenloom.tokenize._units import prepare_units_dir, unit_output

__all__ = ["BucketPublisher", "publish_to_url"]

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
    output = unit_output(config, inputs.tokenizer)
    output.check()  # a tokenizer without a chat template: before any put
    with BucketPublisher(config) as publisher:
        groups, datasets = publisher.datasets(inputs)
        many = config.many_datasets
        if config.overwrite:  # the old dataset goes, its manifest first
            datasets[0].clear()
        alone = config.nodes.alone and not many
        for dataset in datasets:
            dataset.manifest = dataset.complete(overwrite_hint=alone)  # --overwrite: one process only (_config)
        if all(d.manifest is not None for d in datasets):
            return _summary(config, output, publisher.root, groups, datasets, Session(), started, already_complete=True)
        for dataset in datasets:  # before anything is put under the URL
            if dataset.manifest is None and not config.overwrite:
                dataset.check_foreign()
        ray = config.executor is ExecutorKind.RAY and not config.finalize
        if ray:
            preflight(config.ray_address)  # an unreachable cluster fails before anything is put at the URL
        recorded: int | None = None
        for dataset in datasets:
            prepare_units_dir(local_config(config, dataset.staging))
            if dataset.manifest is None:
                dataset.establish_plan()
                recorded = dataset.establish_nodes(config.nodes.recorded)
        local = local_config(config, publisher.root)
        session = Session()
        if ray:  # each task stages, uploads and commits its unit on its own machine
            (only,) = datasets
            pending = [u for u in range(len(only.plan.units)) if not only.at_url(u)]
            # a record store's units are merged below, as the last node of a --num-nodes run does
            session = output.encode(inputs, groups, on_progress, Delivery(units=pending, upload=only.upload))
        elif not config.finalize:
            publisher.sync()
            local_output = unit_output(local, inputs.tokenizer)
            session = local_output.encode(inputs, groups, on_progress, Delivery(on_commit=publisher.commit_unit))
            publisher.drain()  # every unit committed here is at the URL now
            if not many:
                datasets[0].mark_finished(config.nodes.rank)
        single = not (config.finalize or ray or many)
        everyone = single and recorded is not None and datasets[0].all_finished(recorded)
        for dataset in datasets:
            dataset.manifest = dataset.manifest or dataset.finish(
                inputs.tokenizer,
                required=config.finalize or everyone,
                nodes=config.nodes.count if many else recorded,
                everyone=everyone,
            )
        summary = _summary(config, output, publisher.root, groups, datasets, session, started)
        if all(d.manifest is not None for d in datasets):
            shutil.rmtree(publisher.root, ignore_errors=True)
    return summary


def _summary(
    config: TokenizeConfig,
    output: UnitOutput,
    root: Path,
    groups: list[list[TreeDataset]],
    datasets: list[BucketDataset],
    session: Session,
    started: float,
    *,
    already_complete: bool = False,
) -> TokenizeSummary:
    """One summary over the datasets' manifests; while some are not published, what this node encoded."""
    targets = [target for group in groups for target in group]
    published = [d.manifest for d in datasets]
    summary = output.summary(root, targets, published, session, time.perf_counter() - started)
    unfinished = [d for d in datasets if d.manifest is None]
    if unfinished:
        summary.units_missing = sum(d.missing() for d in unfinished)
    summary.output_dir = config.output_url  # type: ignore[assignment]
    summary.already_complete = already_complete
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
        key: dict[str, Any] = {"node": [config.nodes.count or 1, config.nodes.rank]}
        if config.many_datasets:
            key.update(inputs.run_key(config), layout=config.layout.value, unit_bytes=config.unit_bytes)
        else:
            key.update(inputs.plan(config).run_key)
        self.root = staging_dir(self.url, key, config.plan_cache_dir)
        groups = datasets_of(config, inputs, self.root)
        records = local_config(config, self.root) if config.train_type is not None else None
        for targets, first in zip(groups, first_units(groups), strict=True):
            self.groups.append([self._dataset(target, first, records) for target in targets])
        return groups, list(self._by_dir.values())

    def _dataset(self, target: TreeDataset, first: int, records: TokenizeConfig | None) -> BucketDataset:
        out = target.out
        relative = out.relative_to(self.root).as_posix()
        url = self.url if out == self.root else parse_url(f"{str(self.url).rstrip('/')}/{relative}")
        self._by_dir[out] = BucketDataset(RemoteTarget(url, self.options), out, target.plan, first, records=records)
        return self._by_dir[out]

    def sync(self) -> None:
        """This node's staged done markers as the URLs have them; what is staged but not at a URL is queued.

        A leaf's unit is skipped (pending_units looks at its first dataset's staged marker) only when every
        dataset of the leaf has it: otherwise every staged marker of it is removed, so the unit is encoded again.
        """
        for group in self.groups:
            mine = self.config.nodes.units(len(group[0].plan.units), group[0].first)
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
