"""``tokenloom curriculum plan|report|status`` and the ``tokenloom validate --curriculum`` validator."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np
import orjson

from tokenloom.curriculum._config import BudgetUnit, CurriculumConfig
from tokenloom.curriculum._status import read_run_status
from tokenloom.formats import DataError, FormatError, MissingFileError

if TYPE_CHECKING:  # the dataset, the findings and the plot import torch or matplotlib: only the commands that
    # build a dataset import them, so `--help` and `curriculum status` start without torch
    from tokenloom.curriculum._dataset import CurriculumDataset
    from tokenloom.curriculum._findings import Finding

__all__ = ["curriculum", "validate_curriculum"]

BUDGET_HELP = (
    "Budget check (with --global-batch-size and --max-steps): the loop reads max_steps x global_batch_size "
    "samples; the curriculum has len(ds) samples (its budget tokens / tokens per sample, exactly as planned). "
    "They match when max_steps == len(ds) // global_batch_size; anything else is blocking unless "
    "allow_budget_mismatch: true."
)


_PIPE_WIDTH = 10_000  # columns of a console that is not a terminal: tables keep their natural width


def _tokens(n: float) -> str:
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def _print_plan(plan: dict[str, Any], found: list[Finding]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    if not console.is_terminal:  # piped: lay the tables out at their natural width, never cut a name
        console = Console(highlight=False, width=_PIPE_WIDTH)
    console.print(
        f"curriculum {plan['config']}: {plan['samples']:,} samples, {plan['tokens']:,} budget tokens, "
        f"seq_len {plan['max_length']}, packing {plan['packing']}, policy {plan['policy']}, seed {plan['seed']}"
    )
    console.print(f"budget unit: {plan['budget_unit_definition']}")
    inventory = Table(title="buckets (one epoch)", title_justify="left")
    for column in ("bucket", "samples", "budget tokens", "disk tokens", "entries", "shards", "demand", "of epoch"):
        if column == "bucket":
            inventory.add_column(column, overflow="fold")  # a narrow terminal folds a name, never cuts it
        else:
            inventory.add_column(column, justify="right")
    for b in plan["buckets"]:
        share = b["demand_samples"] / b["samples"] if b["samples"] else 0.0
        inventory.add_row(
            b["name"], f"{b['samples']:,}", _tokens(b["budget_tokens"]), _tokens(b["disk_tokens"]),
            f"{b['entries']:,}", str(b["shards"]), _tokens(b["demand_tokens"]), f"{share:.1%}",
        )  # fmt: skip
    console.print(inventory)
    block = [b for b in plan["buckets"] if b.get("order") == "block"]
    if block:
        named = [
            f"{b['name']} (blocks of {b['block_samples']:,} samples, {b['window_blocks']} a window)" for b in block
        ]
        rest = "; the other buckets feistel" if len(block) < len(plan["buckets"]) else ""
        console.print("order block: " + ", ".join(named) + rest)
    phases = Table(title="phases", title_justify="left")
    for column in ("phase", "samples", "start", "end", "target tokens", "tokens", "mix (token weights)"):
        if column.startswith("mix"):
            phases.add_column(column, overflow="fold")
        else:
            phases.add_column(column, justify="right")
    for p in plan["phases"]:
        mix = ", ".join(f"{name} {weight:.3g}" for name, weight in p["mix"].items() if weight > 0)
        phases.add_row(
            str(p["index"]), f"{p['samples']:,}", f"{p['start_sample']:,}", f"{p['end_sample']:,}",
            _tokens(p["target_tokens"]), _tokens(p["tokens"]), mix,
        )  # fmt: skip
    console.print(phases)
    if plan["drains"]:
        drains = Table(title="drain points (exact)", title_justify="left")
        for column in ("bucket", "sample", "token", "phase", "epochs", "effect"):
            drains.add_column(column, overflow="fold")
        for d in plan["drains"]:
            drains.add_row(d["bucket"], f"{d['sample']:,}", f"{d['token']:,}", str(d["phase"]), str(d["epochs"]),
                           d["effect"])  # fmt: skip
        console.print(drains)
    else:
        console.print("drain points: none (no bucket runs dry)")
    for finding in found:
        console.print(f"  {finding.severity.upper():<8} {finding.code}: {finding.message}")
    errors = sum(f.severity == "error" for f in found)
    warnings = sum(f.severity == "warning" for f in found)
    console.print(f"summary: {errors} blocking, {warnings} warning(s)")


def validate_curriculum(
    config: Path,
    *,
    seed: int = 0,
    global_batch_size: int | None = None,
    max_steps: int | None = None,
    plan_cache_dir: str | os.PathLike[str] | None = None,
    as_json: bool = False,
    plot: Path | None = None,
) -> int:
    """Print the plan and the findings of ``config``; return the exit code (0 clean, 2 warnings, 1 blocking)."""
    from tokenloom.curriculum._findings import validate
    from tokenloom.curriculum._plot import plot_plan

    code, found, plan = validate(
        config, seed=seed, global_batch_size=global_batch_size, max_steps=max_steps, plan_cache_dir=plan_cache_dir
    )
    if as_json:
        payload = {"exit_code": code, "findings": [dataclasses.asdict(f) for f in found], "plan": plan}
        click.echo(orjson.dumps(payload, option=orjson.OPT_INDENT_2).decode())
    elif plan is not None:
        _print_plan(plan, found)
    else:
        for finding in found:
            click.echo(f"  {finding.severity.upper():<8} {finding.code}: {finding.message}")
        click.echo(f"summary: {sum(f.severity == 'error' for f in found)} blocking")
    if plot is not None and plan is not None:
        plot_plan(plan, plot)
        if not as_json:
            click.echo(f"plot: {plot}")
    return code


@click.group(epilog="Example:  tokenloom curriculum plan curriculum.yaml --plot plan.png")
def curriculum() -> None:
    """Token-budget curricula: the exact plan, the realised mix, a run's status."""


_seed = click.option("--seed", type=int, default=0, show_default=True, help="The training seed (keys the order).")


_cache = click.option("--plan-cache-dir", type=click.Path(path_type=Path), default=None, help="Packing-plan cache.")


@curriculum.command(
    epilog="\b\nExamples:\n  tokenloom curriculum plan curriculum.yaml --plot plan.png\n"
    "  tokenloom curriculum plan gpt_simple.yaml --global-batch-size 512 --max-steps 20000 --json\n\n" + BUDGET_HELP
)
@click.argument("config", type=click.Path(path_type=Path))
@_seed
@click.option("--global-batch-size", type=click.IntRange(min=1), default=None, help="Samples per optimizer step.")
@click.option("--max-steps", type=click.IntRange(min=1), default=None, help="Steps the training loop runs.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan and findings as JSON.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write a PNG of the mix.")
@_cache
def plan(config: Path, **options: Any) -> None:
    """The exact plan: inventory per bucket, demand per phase, every drain point, findings.

    Exit code 0 when clean, 2 with warnings only, 1 when anything blocks (as GPT-Simple's validator).
    """
    raise SystemExit(validate_curriculum(config, **options))  # the options are validate_curriculum's keywords


def realised(ds: CurriculumDataset, position: int, *, chunk: int = 4096, progress: bool = True) -> dict[str, Any]:
    """Realised vs target budget tokens per phase and bucket over samples [0, position), with loss and padding.

    ``target_tokens``: the config's weight times the phase's realised tokens; ``planned_tokens``: what the
    plan scheduled (after any renormalisation; equal to the realised tokens for fixed windows).
    """
    from rich.progress import Progress

    names = ds.buckets
    position = min(position, ds.halt_position if ds.halt is not None else len(ds))
    rows: dict[tuple[int, int], dict[str, int]] = {}
    with Progress(transient=True, disable=not progress) as bar:
        task = bar.add_task("reading samples", total=position)
        for start in range(0, position, chunk):
            positions = np.arange(start, min(start + chunk, position))
            phase, bucket, _ = ds.locate(positions)
            budget = ds.budget_tokens(positions)
            batch = ds.__getitems__(positions.tolist()).batched
            loss = (batch["labels"] != -100).sum(dim=1).numpy()
            padding = ds.config.seq_len - ds.budget_tokens(positions, BudgetUnit.INPUT_TOKENS)
            for p, b in {(int(p), int(b)) for p, b in zip(phase, bucket, strict=True)}:
                mask = (phase == p) & (bucket == b)
                row = rows.setdefault((p, b), {"samples": 0, "tokens": 0, "loss_tokens": 0, "padding": 0})
                row["samples"] += int(mask.sum())
                row["tokens"] += int(budget[mask].sum())
                row["loss_tokens"] += int(loss[mask].sum())
                row["padding"] += int(padding[mask].sum())
            bar.advance(task, len(positions))
    phases = []
    for p, duration in enumerate(ds.phase_budgets):
        mine = {names[b]: row for (q, b), row in rows.items() if q == p}
        total = sum(row["tokens"] for row in mine.values())
        if not mine:
            continue
        mix = (
            ds.config.curriculum[p].mix
            if ds.config.curriculum is not None
            else dict(zip(names, ds.schedule.weights[0].tolist(), strict=True))
        )
        start, end = ds.schedule.phase_bounds[p]
        before, after = ds.schedule.counts_before(start), ds.schedule.counts_before(min(end, position))

        phases.append(
            {
                "phase": p,
                "target_tokens": duration,
                "tokens": total,
                "buckets": {
                    name: {
                        **row,
                        "target_tokens": round(mix.get(name, 0.0) * total),
                        "planned_tokens": _planned(
                            ds, names.index(name), int(before[names.index(name)]), int(after[names.index(name)])
                        ),
                        "share": row["tokens"] / total,
                    }
                    for name, row in sorted(mine.items())
                },
            }
        )
    return {"position": position, "budget_unit": ds.config.unit.value, "phases": phases}


def _planned(ds: CurriculumDataset, bucket: int, before: int, after: int) -> int:
    tokens, samples = ds.schedule.bucket_tokens[bucket], ds.schedule.bucket_samples[bucket]
    return (after * tokens) // samples - (before * tokens) // samples


@curriculum.command(
    epilog="\b\nExamples:\n  tokenloom curriculum report curriculum.yaml --step 1000 --global-batch-size 512\n"
    "  tokenloom curriculum report curriculum.yaml --state run/sampler_state.json"
)
@click.argument("config", type=click.Path(path_type=Path))
@_seed
@click.option("--step", type=click.IntRange(min=0), default=None, help="Steps done (with --global-batch-size).")
@click.option("--global-batch-size", type=click.IntRange(min=1), default=None, help="Samples per step.")
@click.option(
    "--state",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A saved sampler or curriculum state (JSON with 'consumed').",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_cache
def report(
    config: Path,
    seed: int,
    step: int | None,
    global_batch_size: int | None,
    state: Path | None,
    as_json: bool,
    plan_cache_dir: Path | None,
) -> None:
    """Realised vs target tokens per phase and bucket up to a step, with loss tokens and padding beside them."""
    try:
        if state is not None:
            position = _consumed(state)
        elif step is not None and global_batch_size is not None:
            position = step * global_batch_size
        else:
            raise click.UsageError("give --step with --global-batch-size, or --state")
        from tokenloom.curriculum._dataset import CurriculumDataset

        ds = CurriculumDataset(CurriculumConfig.from_file(config), seed=seed, plan_cache_dir=plan_cache_dir)
        end = ds.halt_position if ds.halt is not None else len(ds)
        if position > end:  # said, not silently clamped
            why = (
                f"the run halts at sample {end:,} (bucket exhaustion)"
                if ds.halt is not None
                else (f"the curriculum ends at sample {end:,}")
            )
            click.echo(f"note: sample {position:,} is past the end: {why}; reporting up to it", err=True)
        result = realised(ds, position, progress=not as_json)
    except DataError as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    if as_json:
        click.echo(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
        return
    click.echo(f"up to sample {result['position']:,} (budget unit: {ds.config.unit.description})")
    click.echo(
        f"{'phase':>5} {'bucket':<12} {'tokens':>12} {'target':>12} {'share':>7} {'loss tok':>12} {'padding':>10}"
    )
    for phase in result["phases"]:
        for name, row in phase["buckets"].items():
            click.echo(
                f"{phase['phase']:>5} {name:<12} {row['tokens']:>12,} {row['target_tokens']:>12,} "
                f"{row['share']:>7.2%} {row['loss_tokens']:>12,} {row['padding']:>10,}"
            )


def _consumed(state: Path) -> int:
    """The ``consumed`` position of a saved sampler state (JSON), or a FormatError naming the file."""
    hint = "Pass the sampler state JSON saved with the checkpoint (sampler_state_from_loader(loader.state_dict()))"
    try:
        saved = orjson.loads(state.read_bytes())
    except OSError as exc:
        raise MissingFileError(f"cannot read the sampler state: {exc.strerror}", path=state, hint=hint) from None
    except orjson.JSONDecodeError as exc:
        raise FormatError(f"the sampler state is not JSON ({exc})", path=state, hint=hint) from None
    consumed = saved.get("consumed") if isinstance(saved, dict) else None
    if isinstance(consumed, bool) or not isinstance(consumed, int) or consumed < 0:
        raise FormatError(f"the sampler state has no 'consumed' position (got {consumed!r})", path=state, hint=hint)
    return consumed


@curriculum.command(epilog="Example:  tokenloom curriculum status outputs/run1")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
def status(run_dir: Path) -> None:
    """A run's status (run_status.json). Exit 3 when it is halted: terminal, do not auto-resume."""
    try:
        record = read_run_status(run_dir)
    except DataError as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    if record is None:
        missing = MissingFileError(
            f"{run_dir} has no run status (run_status.json)",
            path=run_dir,
            hint="Pass the directory your training loop gives to record_halt(run_dir, error) or "
            "write_run_status(run_dir, status)",
        )
        raise click.ClickException(f"{type(missing).__name__}: {missing}")
    for key, value in record.items():
        click.echo(f"{key:<12} {value}")
    fetched, used = record.get("fetched_bytes"), record.get("used_bytes")
    if type(fetched) is int and type(used) is int and used > 0:  # from CurriculumDataset.fetch_figures
        click.echo(
            f"fetched/used {fetched / used:.2f}: {fetched:,} bytes of token blocks fetched by this node for "
            f"{used:,} bytes of samples used" + (" (order: block keeps it near 1)" if fetched > 1.5 * used else "")
        )
    if record["status"] == "halted":
        click.echo("halted is terminal: change the exhaustion policy before resuming (see the message)")
        raise SystemExit(3)
