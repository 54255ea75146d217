"""The demo's curriculum leg: docstring buckets, a two-phase YAML, elastic training, the schedule oracle.

corpus -> modules / classes / functions buckets (each with a val split) -> tokenize into
train/<bucket> and val/<bucket> -> curriculum.yaml (two phases) -> ``tokenloom validate
--curriculum`` and ``tokenloom curriculum plan --plot`` -> 2 ranks x 2 workers until a
checkpoint inside the second phase (phase 1) -> restart on 3 ranks x 1 worker -> the end of the curriculum ->
every position once, each sample the one the schedule puts there, realised vs target mix.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import click
import numpy as np
import orjson
import torch
import yaml
from torchdata.stateful_dataloader import StatefulDataLoader

from tokenloom.curriculum import CurriculumConfig, CurriculumDataset, build_plan
from tokenloom.datasets import SampleBatch, collate
from tokenloom.formats import ConfigError, ResumeMismatchError
from tokenloom.formats.io import atomic_write_bytes
from tokenloom.sampler import ResumableDistributedSampler, sampler_state_from_loader
from tokenloom.tokenize import TokenizeConfig, tokenize

__all__ = ["BUCKETS", "CurriculumReport", "run_command", "run_curriculum", "run_rank", "split_corpus", "train_legs"]

BUCKETS = ("modules", "classes", "functions")
MIXES = (
    {"modules": 0.5, "classes": 0.3, "functions": 0.2},  # phase 0: overview first
    {"modules": 0.1, "classes": 0.3, "functions": 0.6},  # phase 1: the details
)
MAX_LENGTH = 128
BATCH = 8  # per rank
VAL_EVERY = 10  # every 10th document of a bucket goes to val/<bucket>
LOADER_TIMEOUT = 120  # seconds a DataLoader worker may take for one batch before the demo fails


@dataclass
class CurriculumReport:
    config: Path | None = None
    plan_plot: Path | None = None
    plan_text: Path | None = None
    validate_exit: int | None = None
    plan_exit: int | None = None
    documents: dict[str, tuple[int, int]] = field(default_factory=dict)  # bucket -> (train, val) documents
    samples: int = 0
    phase_bounds: list[tuple[int, int]] = field(default_factory=list)
    checkpoint: int = 0
    steps_before: int = 0
    steps_after: int = 0
    # per phase: bucket -> (target share, realised share), shares of the phase's budget tokens
    mix: list[dict[str, tuple[float, float]]] = field(default_factory=list)
    tolerance: list[float] = field(default_factory=list)
    duplicates: int = 0
    missing: int = 0
    wrong_samples: int = 0
    exactly_once: bool = False
    mix_ok: bool = False


# -- buckets from the corpus ----------------------------------------------------------------
@functools.cache
def _package_dirs(name: str) -> tuple[Path, ...]:
    """Directories of the stdlib package ``name`` (found on disk, nothing imported)."""
    parent, _, leaf = name.rpartition(".")
    if not parent:
        spec = importlib.util.find_spec(name) if name in sys.stdlib_module_names else None
        return tuple(Path(p) for p in (spec.submodule_search_locations or [])) if spec else ()
    return tuple(d / leaf for d in _package_dirs(parent) if (d / leaf / "__init__.py").is_file())


def _is_module(name: str) -> bool:
    parent, _, leaf = name.rpartition(".")
    if not parent:
        return name in sys.stdlib_module_names
    return any((d / f"{leaf}.py").is_file() or (d / leaf / "__init__.py").is_file() for d in _package_dirs(parent))


def bucket_of(doc_id: str) -> str:
    """modules (a module's docstring), classes (a CamelCase name) or functions (functions and methods)."""
    if _is_module(doc_id):
        return "modules"
    return "classes" if doc_id.rpartition(".")[2][:1].isupper() else "functions"


def split_corpus(corpus: Path, out: Path) -> dict[str, tuple[int, int]]:
    """``out/<split>/<bucket>/docs.jsonl``: every VAL_EVERY-th document of a bucket is val."""
    docs: dict[str, list[bytes]] = {b: [] for b in BUCKETS}
    for line in corpus.read_bytes().splitlines():
        if line:
            docs[bucket_of(orjson.loads(line)["id"])].append(line)
    counts = {}
    for bucket, lines in docs.items():
        val = lines[VAL_EVERY - 1 :: VAL_EVERY]
        train = [line for i, line in enumerate(lines) if i % VAL_EVERY != VAL_EVERY - 1]
        if not train or not val:
            raise ConfigError(f"the corpus has too few {bucket} docstrings for a train and a val split")
        for split, part in (("train", train), ("val", val)):
            directory = out / split / bucket
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "docs.jsonl").write_bytes(b"\n".join(part) + b"\n")
        counts[bucket] = (len(train), len(val))
    return counts


def tokenize_buckets(text: Path, data: Path) -> None:
    """Each split/bucket tokenized with the shipped BPE, in this process (they are small)."""
    for split in ("train", "val"):
        for bucket in BUCKETS:
            tokenize(
                TokenizeConfig(
                    input_dir=text / split / bucket,
                    output_dir=data / split / bucket,
                    num_workers=0,
                    overwrite=True,
                )
            )


def write_config(data: Path, path: Path, *, order: dict[str, Any] | None = None) -> Path:
    """Two phases sized from the buckets' budget tokens so that no bucket runs dry (85% of the tightest).

    ``order``: the data block's ``order``/``block_samples``/``window_blocks`` keys (the remote demo reads its
    buckets in block order)."""
    probe = CurriculumDataset(CurriculumConfig(path=data, seq_len=MAX_LENGTH, packing=False), seed=0)
    budget = {b["name"]: b["budget_tokens"] for b in build_plan(probe)["buckets"]}
    demand = {name: sum(m[name] / sum(m.values()) for m in MIXES) for name in BUCKETS}
    duration = int(0.85 * min(budget[name] / demand[name] for name in BUCKETS)) // 1000 * 1000
    block = {
        "data": {
            "path": "./" + data.name if data.parent == path.parent else str(data),
            "seq_len": MAX_LENGTH,
            "packing": False,
            "curriculum": [{"duration_tokens": duration, "mix": dict(mix)} for mix in MIXES],
            "allow_bucket_exhaustion": False,
            **(order or {}),
        }
    }
    path.write_text(
        "# written by `tokenloom demo`: GPT-Simple's data block, two phases over docstring buckets\n"
        + yaml.safe_dump(block, sort_keys=False)
    )
    return path


def run_command(name: str, args: Sequence[str], log: Path) -> int:
    """A ``tokenloom`` subcommand in this process (via its entry point); its output appended to ``log``."""
    commands = {ep.name: ep for ep in entry_points(group="tokenloom.commands")}
    command = commands[name].load()
    out = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            command.main(list(args), prog_name=f"tokenloom {name}", standalone_mode=False)
        except SystemExit as exc:
            code = int(exc.code or 0)
        except click.ClickException as exc:  # a DataError, as the command line prints it (exit 1)
            exc.show(out)
            code = exc.exit_code
    with log.open("a") as handle:
        handle.write(f"$ tokenloom {name} {' '.join(args)}\n{out.getvalue()}(exit {code})\n\n")
    return code


# -- training -------------------------------------------------------------------------------
class WithPositions(torch.utils.data.Dataset):
    """The curriculum dataset plus each sample's global position (what the sampler asked for)."""

    def __init__(self, dataset: CurriculumDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices: Sequence[int]) -> SampleBatch:
        batch = self.dataset.__getitems__(indices)
        return SampleBatch({**batch.batched, "position": torch.as_tensor(list(indices), dtype=torch.int64)})

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {key: value[0] for key, value in self.__getitems__([index]).batched.items()}


@dataclass
class _Consumed:
    positions: list[np.ndarray] = field(default_factory=list)
    buckets: list[np.ndarray] = field(default_factory=list)
    inputs: list[np.ndarray] = field(default_factory=list)

    def add(self, batch: dict[str, torch.Tensor]) -> None:
        self.positions.append(batch["position"].numpy())
        self.buckets.append(batch["bucket"].numpy())
        self.inputs.append(batch["input_ids"].numpy())


def run_rank(
    dataset: torch.utils.data.Dataset,
    *,
    world: int,
    rank: int,
    batch_size: int,
    workers: int,
    state: dict[str, Any] | None,
    max_steps: int | None,
    on_batch: Callable[[dict[str, torch.Tensor]], None],
    shuffle: bool = True,
    seed: int = 0,
) -> tuple[int, dict[str, Any]]:
    """One simulated rank of ``world``: its loader from ``state`` (None: the start) for ``max_steps`` batches
    (None: to the end of the epoch), each handed to ``on_batch``. Returns the steps and the sampler state."""
    sampler = ResumableDistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed, pad=False)
    if state is not None:
        sampler.load_state_dict(state)
    with warnings.catch_warnings():  # torchdata 0.11 calls a deprecated torch API on every loader
        warnings.filterwarnings("ignore", message=".*set_vital.*")
        loader = StatefulDataLoader(
            dataset,
            sampler=sampler,
            batch_size=batch_size,
            num_workers=workers,
            collate_fn=collate,
            timeout=LOADER_TIMEOUT if workers else 0,
        )
        iterator = iter(loader)
    steps = 0
    for batch in iterator:
        on_batch(batch)
        steps += 1
        if max_steps is not None and steps == max_steps:
            break
    return steps, sampler_state_from_loader(loader.state_dict())


def run_curriculum(workdir: Path, corpus: Path, *, seed: int, log: Callable[[str], None]) -> CurriculumReport:
    report = CurriculumReport()
    text, data = workdir / "buckets-text", workdir / "buckets"
    report.documents = split_corpus(corpus, text)
    tokenize_buckets(text, data)
    config = write_config(data, workdir / "curriculum.yaml")
    report.config = config
    log(f"   curriculum config: {config}")
    report.plan_text = workdir / "curriculum-plan.txt"
    report.plan_text.unlink(missing_ok=True)
    report.validate_exit = run_command("validate", ["--curriculum", str(config)], report.plan_text)
    report.plan_plot = workdir / "curriculum-plan.png"
    report.plan_exit = run_command(
        "curriculum", ["plan", str(config), "--seed", str(seed), "--plot", str(report.plan_plot)], report.plan_text
    )
    if report.validate_exit != 0 or report.plan_exit != 0:
        return report  # the summary shows the exit codes; run_demo fails the check

    consumed = _Consumed()
    resumed = train_legs(config, seed, workdir / "curriculum-checkpoint.json", consumed, report, log=log)
    _check(resumed, consumed, report)
    return report


def train_legs(
    config: Path,
    seed: int,
    checkpoint: Path,
    consumed: _Consumed,
    report: CurriculumReport,
    *,
    log: Callable[[str], None],
    leg: Callable[[int], contextlib.AbstractContextManager[Any]] = lambda _number: contextlib.nullcontext(),
) -> CurriculumDataset:
    """2 ranks x 2 workers to a checkpoint a third into phase 1, stop; 3 ranks x 1 worker from it to the end.

    ``leg(0)`` and ``leg(1)`` wrap the two legs (a new node's environment, measurements). Returns the
    resumed dataset (for the oracle).
    """
    with leg(0):
        dataset = CurriculumDataset(config, seed=seed)
        report.samples = len(dataset)
        report.phase_bounds = [(int(a), int(b)) for a, b in dataset.schedule.phase_bounds]
        (p1_start, p1_end) = report.phase_bounds[1]
        global_batch = 2 * BATCH
        steps = -(-(p1_start + (p1_end - p1_start) // 3) // global_batch)  # a third into phase 1, whole steps
        if not p1_start < steps * global_batch < p1_end:
            raise ConfigError(
                f"the checkpoint at sample {steps * global_batch} is not inside phase 1 {report.phase_bounds[1]}"
            )
        log(f"   2 ranks x 2 workers for {steps} steps (the checkpoint falls inside phase 1, the second)")
        states = []
        for rank in range(2):
            done, state = run_rank(
                WithPositions(dataset), world=2, rank=rank, batch_size=BATCH, workers=2, state=None, max_steps=steps,
                on_batch=consumed.add, shuffle=False,
            )  # fmt: skip
            states.append(state)
            report.steps_before = max(report.steps_before, done)
        if any(s != states[0] for s in states[1:]):
            raise ResumeMismatchError(f"ranks disagree on the data state: {states}")
        report.checkpoint = int(states[0]["consumed"])
        atomic_write_bytes(
            checkpoint,
            orjson.dumps({"sampler": states[0], "curriculum": dataset.state_dict(consumed=report.checkpoint)}),
        )
        del dataset

    log("   restart on 3 ranks x 1 worker from the checkpoint, to the end of the curriculum")
    with leg(1):
        saved = orjson.loads(checkpoint.read_bytes())
        resumed = CurriculumDataset(config, seed=seed)
        resumed.load_state_dict(saved["curriculum"])  # refuses another config, seed or data
        for rank in range(3):
            done, _ = run_rank(
                WithPositions(resumed), world=3, rank=rank, batch_size=BATCH, workers=1, state=saved["sampler"],
                max_steps=None, on_batch=consumed.add, shuffle=False,
            )  # fmt: skip
            report.steps_after = max(report.steps_after, done)
    return resumed


def _check(dataset: CurriculumDataset, consumed: _Consumed, report: CurriculumReport) -> None:
    """The schedule oracle: positions once each; every sample the one the schedule puts there; the mix."""
    positions = np.concatenate(consumed.positions)
    buckets = np.concatenate(consumed.buckets)
    inputs = np.concatenate(consumed.inputs)
    counts = np.bincount(positions, minlength=len(dataset))
    report.duplicates = int((counts > 1).sum())
    report.missing = int((counts == 0).sum())
    phase, bucket, index = dataset.locate(positions)
    wrong = buckets != bucket
    for row in np.flatnonzero(~wrong):  # the content: the window the schedule names, read straight from the bucket
        expected = dataset.bucket_dataset(int(bucket[row]))[int(index[row])]["input_ids"].numpy()
        wrong[row] = not np.array_equal(expected, inputs[row])
    report.wrong_samples = int(wrong.sum())
    distinct = len({(int(b), int(i)) for b, i in zip(bucket.tolist(), index.tolist(), strict=True)})
    report.exactly_once = (
        report.duplicates == 0 and report.missing == 0 and report.wrong_samples == 0 and distinct == len(positions)
    )
    plan = build_plan(dataset)
    discrepancy = float(plan["discrepancy_samples"])
    report.mix_ok = True
    for p, mix in enumerate(MIXES):
        in_phase = phase == p
        tokens = dataset.budget_tokens(positions[in_phase])
        total = float(tokens.sum())
        shares = {}
        for b, name in enumerate(dataset.buckets):
            realised = float(tokens[buckets[in_phase] == b].sum()) / total if total else 0.0
            shares[name] = (mix.get(name, 0.0) / sum(mix.values()), realised)
        # the schedule's bound: within D samples of the share at every prefix, plus the phase's edge sample
        tolerance = (discrepancy + 1) * MAX_LENGTH / total if total else 1.0
        report.mix.append(shares)
        report.tolerance.append(tolerance)
        report.mix_ok &= all(abs(t - r) <= tolerance for t, r in shares.values())
