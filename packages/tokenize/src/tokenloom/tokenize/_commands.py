"""The ``tokenloom tokenize`` and ``tokenloom index`` commands (entry points)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import click

from tokenloom.formats.cli import choice, cli_errors, option
from tokenloom.tokenize._config import (
    DEFAULT_UNIT_BYTES,
    TRAIN_TYPES,
    UNIT_FORMAT,
    ExecutorKind,
    Layout,
    OnError,
    TokenizeConfig,
    default_num_workers,
    nodes_from_env,
    supported_formats,
)
from tokenloom.tokenize._progress import progress_bar, rate_text
from tokenloom.tokenize._record_settings import record_formats
from tokenloom.tokenize._summary import RunCounts, TokenizeSummary
from tokenloom.tokenize._tokenize import tokenize as run_tokenize
from tokenloom.tokenize.engine import DEFAULT_VERIFY_FRACTION, Engine
from tokenloom.tokenize.windowing import Windowing

__all__ = ["index", "pack", "tokenize"]


class _FormatChoice(click.Choice):
    """--format's choices, asked of the format registry when first needed (a named --format, --help): a run
    that keeps the default imports no other format folder."""

    def __init__(self) -> None:  # not click.Choice's, which lists the choices at once
        self.case_sensitive = True

    @functools.cached_property
    def choices(self) -> tuple[str, ...]:  # pyright: ignore[reportIncompatibleVariableOverride]
        return (*supported_formats(), *record_formats())


def _head(summary: TokenizeSummary, published: str, wrote: str) -> str:
    if summary.units_total:
        return (
            f"committed {summary.units_committed} unit(s) into {summary.output_dir}; {summary.units_missing} of "
            f"{summary.units_total} units are still to be committed by other nodes (the last one to finish "
            f"{published}; or run the same command with --finalize once all are done)"
        )
    if summary.already_complete:
        return f"{summary.output_dir} is already complete with these settings; nothing to do."
    return f"wrote {summary.output_dir} ({wrote})"


def _summary_lines(summary: TokenizeSummary) -> list[str]:
    if summary.post_training is not None:
        return _record_lines(summary)
    head = _head(summary, "writes the manifest", summary.format)
    if summary.units_total:
        return [
            head,
            f"  this run: {summary.run_tokens:,} tokens from {summary.text_bytes:,} decompressed bytes "
            f"({summary.bytes_read:,} input bytes as stored) in {summary.seconds:.1f} s",
        ]
    if summary.resumed_units and not summary.already_complete:
        head += f" (resumed after {summary.resumed_units} committed units)"
    lines = [
        head,
        f"  documents {summary.documents:,}  entries {summary.entries:,}  tokens {summary.tokens:,}  "
        f"shards {summary.shards}  dtype {summary.dtype}  eos_id {summary.eos_id}",
    ]
    if summary.datasets:
        lines.append(f"  datasets {', '.join(summary.datasets)}")
    if summary.engine:
        lines.append(f"  engine {summary.engine}: {summary.engine_reason}")
    if not summary.already_complete:
        lines.append(_rate_line(summary, f"this run: {summary.run_tokens:,} tokens from "))
    lines.extend(_skipped_lines(summary) or ["  skipped 0 records"])
    if summary.dropped:
        kinds = ", ".join(f"{kind} {count:,}" for kind, count in sorted(summary.dropped.items()))
        lines.append(
            f"  gpt-simple rule: {kinds} (short_text/no_tokens: documents dropped; blank_line/no_text_field: "
            "lines skipped; truncated: cut at 10,001 windows)"
        )
    return lines


_SHARED_OPTIONS = (
    option(
        "--tokenizer",
        default=None,
        help="Hugging Face tokenizer directory or locally cached name. Default: the shipped stdlib BPE (16k).",
    ),
    option(
        "--on-error",
        type=choice(OnError),
        default="raise",
        help="A bad record stops the run (raise) or is counted and skipped (skip).",
    ),
    option("--overwrite", is_flag=True, help="Replace an existing output (tokenize: one written with other settings)."),
    option("--eos-id", type=int, default=None, help="End-of-document id, required if the tokenizer has no EOS token."),
    option(
        "--engine",
        type=choice(Engine),
        default="auto",
        help="Encoding engine. hf: Hugging Face tokenizers. fast: fastokens (an error unless it loads the tokenizer "
        "and gives the same ids as hf on a probe set plus the first documents). auto: fast when that holds, else hf. "
        "The output is the same bytes with either.",
    ),
    option("--progress/--no-progress", default=True, help="Show a progress bar on stderr."),
)


def _shared_options(command: Any) -> Any:
    """The options tokenize and pack both take."""
    return functools.reduce(lambda f, decorate: decorate(f), reversed(_SHARED_OPTIONS), command)


@click.command(
    epilog="Example:\n\n\b\n  tokenloom tokenize --input-dir data/raw --output-dir data/tokens \\\n"
    "      --tokenizer ./my-tokenizer --seq-len 2048 --overlap-size 128 --num-workers 8\n"
    "  tokenloom tokenize --input-dir data/raw --output-dir data/megatron --format megatron \\\n"
    "      --seq-len 2048   # writes data/megatron/data.bin + data.idx",
)
@option(
    "--input-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory searched recursively (sorted by path) for .jsonl, .jsonl.gz, .jsonl.zst, .json.gz, .parquet "
    "and .arrow files (zstd, parquet, Arrow: the corpus extra); or an s3://, gs://, az:// prefix (credentials from "
    "AWS_*/GOOGLE_*/AZURE_* variables; each object fetched once into TOKENLOOM_CACHE_DIR when first read).",
)
@option(
    "--output-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Dataset directory to write; rerunning the same command resumes an interrupted run.",
)
@option(
    "--seq-len",
    "seq_len",
    type=int,
    default=None,
    help="Longest entry in tokens, EOD included; longer documents are windowed. "
    "[default: none: every document is one entry, however long]",
)
@option(
    "--overlap-size",
    type=int,
    default=0,
    help="Tokens shared by consecutive windows (<= seq-len / 2 under --windowing tokenloom).",
)
@option(
    "--windowing",
    type=choice(Windowing),
    default=Windowing.TOKENLOOM.value,
    help="tokenloom: every entry ends with EOD and holds at most --seq-len tokens with it; no redundant tail "
    "windows; empty documents become [EOD]. gpt-simple: GPT-Simple's pretokenize exactly (EOD only where a window "
    "reaches the document's end, entries of up to --seq-len + 1 tokens, its tail windows, documents of no "
    "tokens dropped, its uint16/uint32 choice); needs --seq-len.",
)
@option(
    "--min-text-length",
    type=click.IntRange(min=0),
    default=0,
    help="--windowing gpt-simple only: drop documents of fewer characters, as GPT-Simple's --min_text_length "
    "(its default is 200; pass the value of the run to reproduce).",
)
@option(
    "--num-workers",
    type=int,
    default=default_num_workers(),
    help="Encoding workers: threads of this process with the fast engine (up to 4), else processes "
    "(0: all on the calling thread). The output is the same for any count.",
)
@option(
    "--format",
    "format_",
    type=_FormatChoice(),
    default=None,
    show_default=UNIT_FORMAT,
    help="Output format. native: OUT/unit_UUUUUU_KKKK.bin/.idx + manifest.json. megatron: the prefix OUT/data "
    "(OUT/data.bin + OUT/data.idx). packed: OUT/data.pbin. flat: OUT/shard_NNNNN.npy + manifest.json. "
    "megatron/packed also get OUT/tokenize.json (tokenizer fingerprint, inputs, settings). Non-native formats "
    "are tokenized into the native staging dataset OUT.native-staging (resumable), then converted; the staging "
    "is removed once OUT is published. These formats cannot store overlap prefixes: --overlap-size > 0 is refused "
    "unless --drop-overlap-prefix.",
)
@option(
    "--drop-overlap-prefix",
    is_flag=True,
    help="megatron/flat/packed: accept --overlap-size > 0 and drop the overlap-prefix lengths "
    "(the repeated tokens are then not masked by the loss).",
)
@option("--keep-staging", is_flag=True, help="megatron/flat/packed: keep OUT.native-staging after publishing.")
@option(
    "--text-field",
    default="text",
    help="Field (parquet/Arrow: column) with the text; a dotted path for nested fields (struct columns).",
)
@option(
    "--shard-size-tokens",
    type=int,
    default=100_000_000,
    help="Close a shard once it holds this many tokens.",
)
@option("--max-line-bytes", type=int, default=64 << 20, help="Longer lines are bad records.")
@option("--hash-inputs", is_flag=True, help="Identify inputs by content hash rather than size + mtime.")
@option(
    "--verify-fraction",
    type=click.FloatRange(0.0, 1.0),
    default=DEFAULT_VERIFY_FRACTION,
    help="With the fast engine, re-encode this fraction of documents (by content hash) with hf and stop on a "
    "difference.",
)
@option(
    "--num-nodes",
    type=int,
    default=None,
    help="Processes (machines) sharing this run; each takes the input files (units) u with u % N == R, commits "
    "each unit atomically, and the last to finish writes the manifest. The output is the same bytes for any N. "
    "[default: SLURM_ARRAY_TASK_COUNT, else SLURM_NTASKS, else a single-process run]",
)
@option(
    "--node-rank",
    type=int,
    default=None,
    help="This process's rank in [0, --num-nodes). [default: SLURM_ARRAY_TASK_ID, else SLURM_PROCID, else 0]",
)
@option(
    "--executor",
    type=choice(ExecutorKind),
    default=ExecutorKind.LOCAL.value,
    help="local: this process and its --num-workers pool. ray: every unit as a Ray task on the cluster at "
    '--ray-address (pip install "tokenloom-tokenize[ray]"); the same output bytes. With an s3://, gs://, az:// '
    "--input-dir or --output-dir, each task fetches its unit's input and uploads its unit from its own machine "
    "(its TOKENLOOM_CACHE_DIR); --layout tree and --val-fraction do not run under ray yet.",
)
@option(
    "--layout",
    type=choice(Layout),
    default=Layout.FLAT.value,
    help="tree: IN/<split>/<bucket>/... becomes the datasets OUT/<split>/<bucket>/ in one run (one tokenizer load, "
    "one worker pool): the layout curriculum reads. flat: one dataset from every file under IN.",
)
@option(
    "--val-fraction",
    type=click.FloatRange(0.0, 1.0, max_open=True),
    default=0.0,
    help="Carve this fraction of the training documents into a validation split, chosen by an xxh3-64 hash of "
    "each document's text seeded with --seed (the same documents on any machine or worker count): OUT/train + "
    "OUT/val, or with --layout tree OUT/val/<bucket> beside OUT/train/<bucket>.",
)
@option("--seed", type=int, default=0, help="Seed of the --val-fraction document hash.")
@option(
    "--unit-bytes",
    type=click.IntRange(min=1),
    default=DEFAULT_UNIT_BYTES,
    help="An uncompressed .jsonl larger than this is cut into units of line-aligned byte ranges, a parquet file "
    "into runs of row groups, so one big file spreads over workers and nodes. Compressed "
    ".jsonl.gz / .jsonl.zst / .json.gz and Arrow files are always whole-file units (a compressed stream cannot be "
    "entered in the middle).",
)
@option("--ray-address", default=None, help="--executor ray: the head's HOST:PORT. [default: RAY_ADDRESS]")
@option(
    "--train-type",
    type=click.Choice(TRAIN_TYPES),
    default=None,
    help="Post-training records instead of text: sft ({messages} or {prompt, completion}), dpo ({prompt, chosen, "
    "rejected}) or grpo ({prompt, responses, rewards}), rendered with the chat template, loss masks derived and "
    "verified per record, written to a record store (--format bin-meta, or h5: AstrAI's H5 layout, OUT/data.h5); "
    "one unit-planned run at any node count.",
)
@option(
    "--chat-template",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="--train-type: a Jinja chat template file replacing the tokenizer's own.",
)
@option(
    "--train-roles",
    default="assistant",
    help="--train-type: the roles whose turns are trained, comma-separated.",
)
@option(
    "--truncate",
    type=click.Choice(["skip", "keep-start", "keep-end"]),
    default="skip",
    help="--train-type: a record over --seq-len is skipped and counted (never a silent cut), or cut.",
)
@option(
    "--astrai-config",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    default=None,
    help="AstrAI's preprocessing config (pipeline.json): the sequence, loss_mask and position_ids AstrAI's Pipeline "
    "writes for its sft and pretrain configs (per-message rendering, role masks, max_seq_len, truncation_mode).",
)
@option(
    "--finalize",
    is_flag=True,
    help="Only write the manifest of a --num-nodes run whose units are all committed (when no node could).",
)
@_shared_options
def tokenize(format_: str | None, progress: bool, train_roles: str, **options: Any) -> None:
    """Pre-tokenize jsonl (.gz, .zst), parquet and Arrow files into token shards, in parallel, crash-safely.

    Every entry ends with the tokenizer's EOS token. The output is byte-identical
    for any --num-workers; kill it at any moment and run the same command again
    to continue from the completed shards.
    """
    with cli_errors():
        options["num_nodes"], options["node_rank"] = _nodes(options["num_nodes"], options["node_rank"])
        options["train_type"] = options["train_type"] or ("sft" if options["astrai_config"] else None)
        roles = tuple(role.strip() for role in train_roles.split(",") if role.strip())
        config = TokenizeConfig(format=format_ or UNIT_FORMAT, train_roles=roles, **options)
        with progress_bar(options["input_dir"], enabled=progress) as on_progress:
            summary = run_tokenize(config, on_progress=on_progress)
    for line in _summary_lines(summary):
        click.echo(line)


def _record_lines(summary: TokenizeSummary) -> list[str]:
    stats = summary.post_training or {}
    head = _head(summary, "publishes the store", f"{stats.get('train_type', 'records')} record store, {summary.format}")
    tokens = int(stats.get("tokens", 0) or 0)
    trained = int(stats.get("trained_tokens", 0) or 0)
    share = f" ({trained / tokens:.1%} trained)" if tokens else ""
    errors = stats.get("errors") or {}
    shown = ", ".join(f"{k} {v}" for k, v in errors.items())
    return [
        head,
        f"  records {int(stats.get('records', 0) or 0):,}  tokens {tokens:,}{share}  "
        f"truncated {stats.get('truncated', 0)}  skipped too long {stats.get('skipped_too_long', 0)}  "
        f"skipped bad records {stats.get('skipped_errors', 0)}" + (f" ({shown})" if shown else ""),
    ]


def _rate_line(summary: RunCounts, head: str) -> str:
    return (
        f"  {head}{summary.text_bytes:,} decompressed bytes ({summary.bytes_read:,} input bytes as stored) in "
        f"{summary.seconds:.1f} s = {summary.tokens_per_second:,.0f} tokens/s, "
        f"{rate_text(summary.text_bytes, summary.seconds)} decompressed (start-up included, as on the bar)"
    )


def _skipped_lines(summary: RunCounts) -> list[str]:
    if not summary.skipped:
        return []
    kinds = ", ".join(f"{kind} {count:,}" for kind, count in sorted(summary.skipped.items()))
    return [
        f"  skipped {sum(summary.skipped.values()):,} bad records: {kinds}",
        *(f"    e.g. {example}" for example in summary.examples),
    ]


def _nodes(num_nodes: int | None, node_rank: int | None) -> tuple[int | None, int]:
    """--num-nodes / --node-rank, each defaulting to the Slurm variables when they are set."""
    from_env = nodes_from_env()
    if num_nodes is None and from_env is not None:
        num_nodes = from_env[0]
    if node_rank is None:
        node_rank = from_env[1] if from_env is not None else 0
    return num_nodes, node_rank


@click.command(epilog="Example:\n\n\b\n  tokenloom index data/raw/part-000.jsonl")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@option(
    "--full-hash",
    is_flag=True,
    help="Record a hash of the whole file (checked on every open) rather than of its first and last MiB.",
)
def index(files: tuple[Path, ...], full_hash: bool) -> None:
    """Write a byte-offset index (FILE.jsonl.idx.npy) for random access to each line.

    JsonlIndex(FILE) in Python reads line i without scanning the file, and builds
    the index itself when it is missing or stale.
    """
    from tokenloom.tokenize.jsonl_index import build_index, index_path

    for path in files:
        with cli_errors():
            lines = len(build_index(path, full_hash=full_hash))
        click.echo(f"{index_path(path)}: {lines:,} lines")


@click.command(
    epilog="Example:\n\n\b\n  tokenloom pack data/train.jsonl --tokenizer ./my-tokenizer --output data/train.pbin"
)
@click.argument("input_file", type=click.Path(dir_okay=False, path_type=Path))
@option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Default: FILE.pbin beside the input.",
)
@option("--text-field", default="text", help="Field with the text; a dotted path for nested fields.")
@option("--num-workers", type=int, default=default_num_workers(), help="Encoding processes.")
@option("--legacy", is_flag=True, help="Write the old 8-byte-header layout (uint32 tokens).")
@_shared_options
def pack(input_file: Path, progress: bool, **options: Any) -> None:
    """Tokenize one jsonl file into a Modalities packed data file (.pbin).

    Each document becomes its tokens followed by EOD, in file order.
    """
    from tokenloom.tokenize._pack import pack as run_pack

    with cli_errors(), progress_bar(input_file, enabled=progress, label="pack") as on_progress:
        summary = run_pack(input_file, on_progress=on_progress, **options)
    click.echo(
        f"wrote {summary.output}: {summary.documents:,} documents, {summary.tokens:,} tokens, "
        f"dtype {summary.dtype}, eos_id {summary.eos_id}"
    )
    for line in [
        _rate_line(summary, ""),
        f"  engine {summary.engine}: {summary.engine_reason}",
        *_skipped_lines(summary),
    ]:
        click.echo(line)
