"""``--layout tree`` and ``--val-fraction`` into object storage: every dataset of the tree at its own sub-prefix.

    tokenize(--output-dir s3://b/tokens --layout tree [--val-fraction F] [--num-nodes N --node-rank R])
      -> the datasets of the tree (_tree: a unit-planned dataset per leaf, a carved val dataset beside a train one)
         each at URL/<split>/<bucket> (a RemoteDataset of _remote_units), staged on this node under
         CACHE/uploads/<URL>/<run key + node>/<split>/<bucket>
      -> every dataset's manifest at its URL with this plan: complete, nothing to do (another plan: refused)
      -> each dataset's plan fetched and compared, or created once; this node's done markers fetched
      -> the pending units encoded as on a shared disk (_tree.encode_tree: one tokenizer load, one pool),
         a thread uploading each committed unit (shards, then its done marker; a carved unit's val marker
         before its train marker, so a train marker at the URL means its val part is there too)
      -> every dataset whose units are all committed at its URL: its manifest, uploaded last

The shards are the bytes the same run writes on local disk: the plans are the same, and a unit's bytes
depend only on its input and the settings. A reader of URL/<split>/<bucket> sees no dataset until its
manifest lands; a node killed anywhere is rerun (on any machine) and skips what the bucket holds.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from tokenloom.formats import ConfigError, Manifest
from tokenloom.formats.io.urls import parse_url
from tokenloom.formats.remote.publish import RemoteTarget, staging_dir
from tokenloom.tokenize._config import TokenizeConfig
from tokenloom.tokenize._plan import RunInputs
from tokenloom.tokenize._remote_units import RemoteDataset, UnitUploads
from tokenloom.tokenize._summary import ProgressCallback, TokenizeSummary
from tokenloom.tokenize._tree import TreeDataset, encode_tree, first_units, tree_datasets, tree_summary
from tokenloom.tokenize._unit_files import done_path
from tokenloom.tokenize._unit_upload import local_config
from tokenloom.tokenize._unit_work import Session, dealt_nodes, node_units
from tokenloom.tokenize._units import prepare_units_dir

__all__ = ["run_tree_to_url"]


def run_tree_to_url(
    config: TokenizeConfig, inputs: RunInputs, on_progress: ProgressCallback | None = None
) -> TokenizeSummary:
    """This node's share of a tree (or --val-fraction) run whose output is ``config.output_url``."""
    started = time.perf_counter()
    if config.output_url is None:
        raise ConfigError("run_tree_to_url needs an object-store output_dir", field="output_dir")
    url = parse_url(config.output_url)
    num_nodes = config.num_nodes or 1
    run_key = {
        **inputs.run_key(config),
        "layout": config.layout.value,
        "unit_bytes": config.unit_bytes,
        "node": [num_nodes, config.node_rank],
    }
    root = staging_dir(url, run_key, config.cache_dir)
    local = local_config(config, root)
    per_leaf = tree_datasets(config, inputs, root)
    remote = {
        id(target): RemoteDataset(_target(config, target, root), target.config.output_dir, target.plan)
        for targets in per_leaf
        for target in targets
    }
    complete = {key: dataset.complete() for key, dataset in remote.items()}
    if all(m is not None for m in complete.values()):
        summary = tree_summary(local, [m for m in complete.values() if m is not None], time.perf_counter() - started)
        return _named(summary, str(url), per_leaf, already_complete=True)
    for key, dataset in remote.items():  # before anything is put under the URL
        if complete[key] is None:
            dataset.check_foreign()
    for targets in per_leaf:
        for target in targets:
            prepare_units_dir(target.config)  # its staging directory
            if complete[id(target)] is None:
                remote[id(target)].establish_plan()
                remote[id(target)].establish_nodes(dealt_nodes(config))
    session = Session()
    if not config.finalize:
        groups = _sync(config, per_leaf, remote)
        uploads = UnitUploads(groups)
        uploads.start()
        try:
            session = encode_tree(local, inputs, per_leaf, on_progress)
        finally:
            uploads.stop()
        uploads.sweep()  # whatever committed after the thread's last look
    manifests: list[Manifest] = []
    missing = total_units = 0
    first_of = {
        id(target): first for targets, first in zip(per_leaf, first_units(per_leaf), strict=True) for target in targets
    }
    for key, dataset in remote.items():
        dealt = {"first": first_of[key], "num_nodes": config.num_nodes}
        manifest = complete[key] or dataset.finalize(inputs.tokenizer, required=config.finalize, **dealt)
        if manifest is None:
            missing += dataset.missing()
            total_units += len(dataset.plan.units)
        else:
            manifests.append(manifest)
    summary = tree_summary(local, manifests, time.perf_counter() - started, session)
    summary.units_total, summary.units_missing = total_units, missing
    if total_units:  # not finished: what this node encoded
        summary.documents = session.counts.documents
    else:
        shutil.rmtree(root, ignore_errors=True)
    return _named(summary, str(url), per_leaf)


def _target(config: TokenizeConfig, target: TreeDataset, root: Path) -> RemoteTarget:
    relative = target.config.output_dir.relative_to(root).as_posix()
    return RemoteTarget(parse_url(f"{str(config.output_url).rstrip('/')}/{relative}"), config.storage_options)


def _sync(
    config: TokenizeConfig, per_leaf: list[list[TreeDataset]], remote: dict[int, RemoteDataset]
) -> list[list[tuple[RemoteDataset, int]]]:
    """Staged done markers of this node's units as the URLs have them; the upload groups (val before train).

    A unit is skipped (pending_units looks at its train dataset's staged marker) only when every dataset of
    its leaf has it committed: a train marker without its val part is removed, so the unit is encoded again.
    """
    groups: list[list[tuple[RemoteDataset, int]]] = []
    for targets, first in zip(per_leaf, first_units(per_leaf), strict=True):
        datasets = [remote[id(target)] for target in targets]
        mine = node_units(config, len(targets[0].plan.units), first)
        for dataset in datasets:
            dataset.sync_markers(mine)
        for unit in mine:
            markers = [done_path(dataset.staging, unit) for dataset in datasets]
            if markers[0].exists() and not all(marker.exists() for marker in markers[1:]):
                markers[0].unlink()
            groups.append([(dataset, unit) for dataset in reversed(datasets)])
    return groups


def _named(
    summary: TokenizeSummary, url: str, per_leaf: list[list[TreeDataset]], *, already_complete: bool = False
) -> TokenizeSummary:
    summary.output_dir = url  # type: ignore[assignment]
    summary.already_complete = already_complete
    summary.datasets = sorted(target.name for targets in per_leaf for target in targets)
    return summary
