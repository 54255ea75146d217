"""``tokenize()``: the entry point of a tokenize run, in any supported format.

tokenize(config)
    -> RunInputs.resolve (_plan: tokenizer, input files, run key)
    -> an s3:// / gs:// / az:// output: publish_to_url (_publish: the unit pipeline staged per node, each unit
       uploaded as it commits, the manifest last; one process is --num-nodes 1; a tree: one sub-prefix per dataset)
    -> check_run_paths
    -> one process (no --num-nodes, no Ray, no --finalize, one dataset): the output lock, held for the whole run
    -> run_units (_units: plan, unit commits, manifest; one process is node 0 of 1; one dataset is a tree of
       one leaf, --layout tree / --val-fraction a dataset per leaf: _tree)
       megatron / flat / packed: the same run into a staging dataset, converted at finalize (_staged)
All encode through the one executor (_executor), as ``pack`` does.
"""

from __future__ import annotations

import time
from pathlib import Path

from tokenloom.formats.io import check_disjoint, check_replaceable, output_lock, real_path, storage_errors
from tokenloom.tokenize._config import TokenizeConfig
from tokenloom.tokenize._plan import RunInputs, check_tokenizer_files
from tokenloom.tokenize._summary import ProgressCallback, TokenizeSummary
from tokenloom.tokenize._units import replaceable, run_units

__all__ = ["check_run_paths", "tokenize"]


def tokenize(config: TokenizeConfig, *, on_progress: ProgressCallback | None = None) -> TokenizeSummary:
    """Run (or resume, or confirm) one tokenize job, in any supported format."""
    started = time.perf_counter()
    with storage_errors(config.output_dir, "tokenizing"):
        inputs = RunInputs.resolve(config)
        if config.output_url is not None:  # the remote layer is imported only for a run into object storage
            from tokenloom.tokenize._publish import publish_to_url

            summary = publish_to_url(config, inputs, on_progress)
        else:
            summary = _run(config, inputs, on_progress)
    summary.seconds = time.perf_counter() - started  # this run's wall time, the clock of its rates
    return summary


def _run(config: TokenizeConfig, inputs: RunInputs, on_progress: ProgressCallback | None) -> TokenizeSummary:
    check_run_paths(config, inputs)
    run = run_units  # one dataset, or a tree's leaves (_tree.datasets_of): each a unit-planned dataset
    if config.staged:  # the converting formats' registry specs are imported only for them
        from tokenloom.tokenize._staged import tokenize_via_staging as run
    if not config.nodes.alone or config.many_datasets:  # nodes share OUT; each unit commits, the finalizer locks
        return run(config, inputs, on_progress=on_progress)
    with output_lock(config.output_dir, what="--output-dir"):
        return run(config, inputs, on_progress=on_progress)


def check_run_paths(config: TokenizeConfig, inputs: RunInputs) -> None:
    """Before anything is written or deleted: OUT (and its staging) must be apart from every input."""
    targets = [config.output_dir]
    if config.staged:
        from tokenloom.tokenize._staged import staging_dir

        targets.append(staging_dir(config.output_dir))
    # OUT may lie inside --input-dir (its files are never inputs), but not be it or hold an input
    if real_path(config.output_dir) == real_path(config.input_dir):
        check_disjoint([config.output_dir], [config.input_dir], target_name="--output-dir")
    sources = [*(f.path for f in inputs.files)]
    tokenizer_dir = Path(inputs.tokenizer)
    if tokenizer_dir.exists():
        sources.append(tokenizer_dir)
    check_disjoint(targets, sources, target_name="--output-dir")
    if tokenizer_dir.is_dir():
        check_tokenizer_files(tokenizer_dir)
    if config.overwrite and config.train_type is None:  # a record store's own --overwrite check: _unit_records
        check_replaceable(config.output_dir, replaceable(config.output_dir))
