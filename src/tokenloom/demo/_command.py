"""``tokenloom demo``: the whole flow on the built-in corpus, no download."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import click

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
    "--steps", type=click.IntRange(min=1), default=100, show_default=True, help="Steps per rank before the checkpoint."
)
@click.option("--keep", is_flag=True, help="Keep the workdir (corpus, tokens, plot) instead of cleaning up.")
def demo(workdir: Path | None, steps: int, keep: bool) -> None:
    """Run the whole tokenloom flow on a corpus built from Python's own docstrings.

    Builds the corpus, tokenizes it with the shipped tokenizer on 2 workers,
    validates it, packs it, trains on 2 simulated ranks with a 2-worker
    DataLoader, checkpoints, restarts on 3 ranks, finishes the epoch and checks
    that every sample was consumed exactly once. Writes a PNG of the document
    lengths and the packing padding, and prints where it is.
    """
    from rich.console import Console
    from rich.table import Table

    from tokenloom.demo._flow import run_demo

    console = Console(stderr=False)
    created = workdir is None
    root = Path(tempfile.mkdtemp(prefix="tokenloom-demo-")) if workdir is None else workdir
    root.mkdir(parents=True, exist_ok=True)
    try:
        report = run_demo(root, steps=steps, log=lambda line: console.print(f"[dim]{line}[/dim]"))
        plot_path = report.plot
        if plot_path is not None and created and not keep:
            kept = Path.cwd() / plot_path.name
            shutil.copy2(plot_path, kept)
            plot_path = kept
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
        table.add_row("plot", str(plot_path) if plot_path else "-")
        table.add_row("time", f"{report.seconds:.1f} s")
        for note in report.notes:
            table.add_row("note", note)
        console.print(table)
        if not report.consumed_once:
            sys.exit(1)
    finally:
        if created and not keep:
            shutil.rmtree(root, ignore_errors=True)
        elif keep or not created:
            console.print(f"workdir: {root}")
