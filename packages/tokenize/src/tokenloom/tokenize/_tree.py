"""The datasets of a run, grouped by leaf, and the one local loop that encodes their units (one tokenizer, one pool).

    one dataset:          [[OUT]]                       (a leaf of one dataset: every run is this case with N=1)
    --layout tree:        IN/<split>/<bucket>/**  ->  OUT/<split>/<bucket>/   (one dataset per leaf)
    --val-fraction F:     a train leaf's documents whose seeded text hash is below F
                          -> OUT/val/<bucket> (tree) or OUT/val beside OUT/train (flat input)
    each output is a unit-planned dataset (_units: plan, unit shards, done markers, manifest),
    so --num-nodes, kills and reruns work per dataset exactly as for one; a carved leaf commits
    unit u of its val dataset before unit u of its train dataset (train done => val done)
    the encoder (tokenizer, engine probe, worker pool) starts once; leaves run through it in turn
    into object storage (_publish): the same datasets staged on each node, each at OUT/<split>/<bucket>

This is the layout ``curriculum`` reads (``path`` holding ``train/<bucket>/`` and ``val/<bucket>/``),
and every leaf opens with ``open_dataset``, so ``eval-broadcast``'s PathEvalSource takes a val leaf.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tokenloom.formats import ConfigError
from tokenloom.tokenize._config import Layout, TokenizeConfig
from tokenloom.tokenize._executor import start_encoding
from tokenloom.tokenize._plan import RunInputs
from tokenloom.tokenize._summary import ProgressCallback
from tokenloom.tokenize._transform import transform_for
from tokenloom.tokenize._unit_files import UnitFacts, UnitPlan
from tokenloom.tokenize._unit_work import Session, UnitWriter, encode_units, pending_units
from tokenloom.tokenize.inputs import InputFile

__all__ = ["Leaf", "TreeDataset", "datasets_of", "encode_groups", "first_units", "leaves_of"]

TRAIN, VAL = "train", "val"


@dataclass(frozen=True, slots=True)
class Leaf:
    """One input dataset of the run: its files (named relative to the leaf) and where it is written."""

    name: str
    """``split/bucket`` (tree) or ``train`` (a flat input carved by --val-fraction)."""
    files: list[InputFile]
    out: Path
    val_out: Path | None
    """Where its validation documents go (--val-fraction on a train leaf), else None."""


def leaves_of(config: TokenizeConfig, inputs: RunInputs, out: Path | None = None) -> list[Leaf]:
    """The leaves of the run in path order; files outside ``<split>/<bucket>/`` are a ConfigError.

    ``out``: where the datasets are written (a run into object storage: its local staging root); default
    ``config.output_dir``.
    """
    out = config.output_dir if out is None else out
    carve = config.val_fraction > 0
    if config.layout is not Layout.TREE:
        return [Leaf(TRAIN, inputs.files, out / TRAIN, out / VAL)]
    groups: dict[tuple[str, str], list[InputFile]] = {}
    for info in inputs.files:
        parts = info.relative.split("/")
        if len(parts) < 3:
            raise ConfigError(
                f"input {info.relative} is not inside a <split>/<bucket>/ directory",
                path=info.shown,
                field="layout",
                hint="With --layout tree every input lies under IN/<split>/<bucket>/ (e.g. IN/train/web/part-0.jsonl); "
                "move the file there, or drop --layout tree",
            )
        relative = "/".join(parts[2:])
        groups.setdefault((parts[0], parts[1]), []).append(dataclasses.replace(info, relative=relative))
    splits = sorted({split for split, _ in groups})
    root = config.input_url or str(config.input_dir)  # how messages name IN: its URL, or its path
    if carve and VAL in splits:
        raise ConfigError(
            "--val-fraction would carve OUT/val/<bucket> from train, but the input already has a val split",
            path=f"{root.rstrip('/')}/{VAL}",
            field="val_fraction",
            hint="Drop --val-fraction to keep the given val split, or move IN/val away to carve a new one",
        )
    if carve and TRAIN not in splits:
        raise ConfigError(
            f"--val-fraction carves from the train split, but the input's splits are {', '.join(splits)}",
            path=root,
            field="val_fraction",
            hint="Name the training split's directory train (IN/train/<bucket>/...)",
        )
    return [
        Leaf(f"{split}/{bucket}", files, out / split / bucket, out / VAL / bucket if carve and split == TRAIN else None)
        for (split, bucket), files in sorted(groups.items())
    ]


@dataclass(slots=True)
class TreeDataset:
    """One dataset written by the run: its leaf, config (``output_dir``: where it is written) and plan."""

    leaf: Leaf
    config: TokenizeConfig
    plan: UnitPlan
    role: str

    @property
    def name(self) -> str:
        """Where it lies under OUT: ``split/bucket``; a carved one ``val/bucket`` (tree) or ``val`` (flat input)."""
        if self.role == TRAIN:
            return self.leaf.name
        _, _, bucket = self.leaf.name.partition("/")
        return f"{VAL}/{bucket}" if bucket else VAL

    @property
    def out(self) -> Path:
        return self.config.output_dir


def _targets(config: TokenizeConfig, inputs: RunInputs, leaf: Leaf) -> list[TreeDataset]:
    leaf_config = dataclasses.replace(config, output_dir=leaf.out)
    base = RunInputs(inputs.tokenizer, inputs.tokenizer_fingerprint, leaf.files).plan(leaf_config)
    dataset = {"dataset": leaf.name, "layout_of_input": config.layout.value}
    targets = [TreeDataset(leaf, leaf_config, UnitPlan({**base.run_key, **dataset, "role": TRAIN}, base.units), TRAIN)]
    if leaf.val_out is not None:
        val_config = dataclasses.replace(config, output_dir=leaf.val_out)
        val_plan = UnitPlan({**base.run_key, **dataset, "role": VAL}, base.units)
        targets.append(TreeDataset(leaf, val_config, val_plan, VAL))
    return targets


def datasets_of(config: TokenizeConfig, inputs: RunInputs, out: Path | None = None) -> list[list[TreeDataset]]:
    """The run's datasets, grouped by leaf: ``[train]`` or ``[train, val]`` (a leaf carved by --val-fraction); one
    dataset (no --layout tree, no --val-fraction) is one leaf of one dataset, written into ``out``."""
    if not config.many_datasets:
        config = config if out is None else dataclasses.replace(config, output_dir=out)
        return [[TreeDataset(Leaf("", inputs.files, config.output_dir, None), config, inputs.plan(config), TRAIN)]]
    return [_targets(config, inputs, leaf) for leaf in leaves_of(config, inputs, out)]


def first_units(per_leaf: list[list[TreeDataset]]) -> list[int]:
    """Where each leaf's units start in the count over the whole tree: nodes are dealt units across leaves, so a
    tree of many small leaves (each with fewer units than nodes) still spreads over every node."""
    firsts, total = [], 0
    for targets in per_leaf:
        firsts.append(total)
        total += len(targets[0].plan.units)
    return firsts


def encode_groups(
    config: TokenizeConfig,
    inputs: RunInputs,
    per_leaf: list[list[TreeDataset]],
    on_progress: ProgressCallback | None,
    on_commit: Callable[[Path, int], None] | None = None,
) -> Session:
    """This node's pending units of every leaf (by its train dataset's done markers), through one encoder;
    ``on_commit(out, unit)`` after each dataset's commit of a unit (_publish: a bucket's upload)."""
    session = Session()
    pending = [
        pending_units(targets[0].out, config.nodes, targets[0].plan, first)
        for targets, first in zip(per_leaf, first_units(per_leaf), strict=True)
    ]
    for targets, mine, first in zip(per_leaf, pending, first_units(per_leaf), strict=True):
        session.resumed += len(config.nodes.units(len(targets[0].plan.units), first)) - len(mine)
    if not any(pending):
        return session
    # the engine probe reads the same first documents (inputs.files) on every node
    with start_encoding(inputs.tokenizer, inputs.files, config.encode_options()) as encoding:
        session.facts = facts = UnitFacts.of(encoding)
        settings, options = encoding.settings, config.unit_options()
        if config.val_fraction > 0:  # a train leaf's documents below the seeded hash go to its val dataset
            settings = dataclasses.replace(settings, val_fraction=config.val_fraction, val_seed=config.seed)
        for targets, mine in zip(per_leaf, pending, strict=True):
            if not mine:
                continue
            text = transform_for(settings if len(targets) > 1 else encoding.settings, inputs.tokenizer, encoding)

            def writers(unit: int, targets: list[TreeDataset] = targets) -> list[UnitWriter]:
                return [UnitWriter(t.out, options, unit, t.plan.units[unit], facts, t.plan.digest) for t in targets]

            sources = [targets[0].plan.units[u] for u in mine]
            encode_units(options, sources, mine, text.encode, writers, session, on_progress, on_commit)
    return session
