"""``tokenloom demo``: the whole flow on the built-in corpus, no download."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import click


def _ok(passed: bool, text: str) -> str:
    return f"[green]passed[/green]: {text}" if passed else f"[red]FAILED[/red]: {text}"


def _curriculum_rows(table: Any, report: Any, *, temporary: bool) -> None:
    c = report.curriculum
    if c is None:
        return
    docs = ", ".join(f"{name} {train:,}+{val:,}" for name, (train, val) in c.documents.items())
    table.add_row("buckets", f"train+val docstrings: {docs}")
    where = " (in the temporary workdir, removed at the end: --workdir DIR keeps it)" if temporary else ""
    gone = " (removed at the end)" if temporary else ""
    table.add_row("curriculum", f"{c.config}{where}")
    table.add_row(
        "validate",
        _ok(c.validate_exit == 0 and c.plan_exit == 0, f"validate --curriculum exit {c.validate_exit}, "
            f"curriculum plan exit {c.plan_exit} (output: {c.plan_text}{gone})"),
    )  # fmt: skip
    table.add_row("plan plot", str(c.plan_plot) if c.plan_plot and c.plan_plot.is_file() else "-")
    if not c.phase_bounds:
        return
    bounds = ", ".join(f"phase {p}: samples {a:,}-{b:,}" for p, (a, b) in enumerate(c.phase_bounds))
    table.add_row(
        "curriculum run",
        f"{c.samples:,} samples ({bounds}); {c.steps_before} steps x 2 ranks x 2 workers, checkpoint at sample "
        f"{c.checkpoint:,} (inside phase 1, the second), then {c.steps_after} steps x 3 ranks x 1 worker",
    )
    table.add_row(
        "schedule oracle",
        _ok(c.exactly_once, f"every position once, each the sample the schedule names "
            f"({c.duplicates} duplicated, {c.missing} missing, {c.wrong_samples} wrong)"),
    )  # fmt: skip
    table.add_row("mix", _ok(c.mix_ok, "realised within the schedule's bound in every phase (table below)"))


def _eval_and_stream_rows(table: Any, report: Any) -> None:
    e = report.eval
    if e is not None:
        text = (
            f"{e.rows:,} rows built on rank 0, broadcast to 2 gloo ranks; eval loss {e.loss:.6f} nats over "
            f"{e.tokens:,} tokens (unigram score), equal on both ranks and to one rank's whole-set loss "
            f"({e.seconds:.1f} s)"
            if e.error is None
            else e.error
        )
        table.add_row("eval broadcast", _ok(e.ok, text))
    s = report.stream
    if s is not None:
        table.add_row(
            "streaming",
            _ok(s.bit_exact, f"{s.batches} batches, stopped after 20, resumed in new workers: "
                f"{s.matching} of {s.resumed} resumed batches byte-identical ({s.seconds:.1f} s)"),
        )  # fmt: skip


def _mix_table(report: Any) -> Any:
    from rich.table import Table

    c = report.curriculum
    table = Table(title="curriculum mix: target vs realised share of each phase's budget tokens")
    table.add_column("phase")
    for name in c.mix[0]:
        table.add_column(name, justify="right")
    table.add_column("bound", justify="right")
    for p, (shares, tolerance) in enumerate(zip(c.mix, c.tolerance, strict=True)):
        cells = [f"{target:.1%} / {realised:.1%}" for target, realised in shares.values()]
        table.add_row(str(p), *cells, f"±{tolerance:.2%}")
    return table


EPILOG = """\b
Examples:
  tokenloom demo                      # temporary workdir, removed afterwards
  tokenloom demo --workdir demo --keep --steps 300
"""


@click.command(epilog=EPILOG)
@click.option(
    "--workdir", type=click.Path(file_okay=False, path_type=Path), help="Where to work (default: a temp dir)."
)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Steps per rank before the checkpoint of the epoch leg (the curriculum leg checkpoints in its 2nd phase).",
)
@click.option(
    "--keep",
    is_flag=True,
    help="Keep the temporary workdir (default: removed at the end; a --workdir you name is always kept).",
)
def demo(workdir: Path | None, steps: int, keep: bool) -> None:
    """Run the whole tokenloom flow on a corpus built from Python's own docstrings.

    Builds the corpus, tokenizes it with the shipped tokenizer on 2 workers,
    validates it, packs it, trains on 2 simulated ranks with a 2-worker
    DataLoader, checkpoints, restarts on 3 ranks, finishes the epoch and checks
    that every sample was consumed exactly once.

    Then splits the corpus into module / class / function docstring buckets
    (train and val), writes a two-phase curriculum YAML, validates it and plots
    its plan, trains through it on 2 ranks x 2 workers, checkpoints inside
    its second phase, restarts on 3 ranks x 1 worker and finishes, checking every sample
    against the schedule and the realised mix against the target; builds the
    eval set on rank 0 of 2 gloo processes and broadcasts it (token-weighted
    eval loss); streams the corpus jsonl, stops and resumes bit-exactly.
    Exits 1 if any check fails.
    """
    from rich.console import Console
    from rich.table import Table

    from tokenloom.demo._flow import run_demo

    console = Console(stderr=False)
    created = workdir is None
    root = Path(tempfile.mkdtemp(prefix="tokenloom-demo-")) if workdir is None else workdir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    try:
        report = run_demo(root, steps=steps, log=lambda line: console.print(f"[dim]{line}[/dim]"))
        plot_path = report.plot
        if plot_path is not None and created and not keep:
            kept = Path.cwd() / plot_path.name
            shutil.copy2(plot_path, kept)
            plot_path = kept
        c = report.curriculum
        if c is not None and c.plan_plot is not None and c.plan_plot.is_file() and created and not keep:
            kept = Path.cwd() / c.plan_plot.name  # the workdir goes; the plots stay
            shutil.copy2(c.plan_plot, kept)
            c.plan_plot = kept
        table = Table(title="tokenloom demo", show_header=False)
        table.add_row("corpus", f"{report.corpus_documents:,} stdlib docstrings, {report.corpus_bytes / 1e6:.1f} MB")
        table.add_row(
            "tokens", f"{report.tokens:,} in {report.entries:,} entries, {report.shards} shard(s), validated deep"
        )
        table.add_row(
            "tokenize",
            f"{report.tokenize_tokens_per_second / 1e6:.2f} M tokens/s on 2 workers ({report.tokenize_seconds:.1f} s, "
            "mostly start-up on this small corpus; docs/benchmarks.md has the steady rate)",
        )
        table.add_row("packing", f"{report.packed_sequences:,} sequences, {report.packing_padding:.2%} padding")
        table.add_row(
            "training",
            f"{report.samples:,} samples; {report.steps_before} steps x 2 ranks, then {report.steps_after} x 3 ranks; "
            f"{report.samples_per_second:,.0f} samples/s (including the start of 5 loaders' workers)",
        )
        verdict = (
            "[green]passed[/green]: every sample consumed exactly once"
            if report.consumed_once
            else f"[red]FAILED[/red]: {report.duplicates} duplicated, {report.missing} missing"
        )
        table.add_row("resume check", verdict)
        _curriculum_rows(table, report, temporary=created and not keep)
        _eval_and_stream_rows(table, report)
        table.add_row("plot", str(plot_path) if plot_path else "-")
        legs = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in report.leg_seconds.items())
        table.add_row("time", f"{report.seconds:.1f} s ({legs})")
        for note in report.notes:
            table.add_row("note", note)
        console.print(table)
        if report.curriculum is not None and report.curriculum.mix:
            console.print(_mix_table(report))
        failures = report.failures()
        for failure in failures:
            console.print(f"[red]FAILED[/red]: {failure}")
        if failures:
            sys.exit(1)
    finally:
        if created and not keep:
            shutil.rmtree(root, ignore_errors=True)
        elif keep or not created:
            console.print(f"workdir: {root}")
