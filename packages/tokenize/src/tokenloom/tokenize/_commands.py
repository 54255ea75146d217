"""The ``tokenloom tokenize`` and ``tokenloom index`` commands (entry points)."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import click

from tokenloom.formats import DataError
from tokenloom.formats.cli import cli_errors
from tokenloom.tokenize._config import (
    DEFAULT_UNIT_BYTES,
    RECORD_FORMATS,
    SUPPORTED_FORMATS,
    TRAIN_TYPES,
    ExecutorKind,
    Layout,
    OnError,
    TokenizeConfig,
    default_num_workers,
    nodes_from_env,
)
from tokenloom.tokenize._progress import progress_bar, rate_text
from tokenloom.tokenize._summary import TokenizeSummary
from tokenloom.tokenize._tokenize import tokenize as run_tokenize
from tokenloom.tokenize.engine import DEFAULT_VERIFY_FRACTION, Engine
from tokenloom.tokenize.windowing import Windowing

__all__ = ["index", "pack", "tokenize"]


def fail_command(exc: BaseException) -> NoReturn:
    with cli_errors():
        raise exc
    raise exc  # cli_errors re-raises what it does not handle; this line only informs the type checker


def _summary_lines(summary: TokenizeSummary) -> list[str]:
    if summary.post_training is not None:
        return _record_lines(summary)
    if summary.units_total:
        return [
            f"committed {summary.units_committed} unit(s) into {summary.output_dir}; {summary.units_missing} of "
            f"{summary.units_total} units are still to be committed by other nodes (the last one to finish writes "
            "the manifest; or run the same command with --finalize once all are done)",
            f"  this run: {summary.run_tokens:,} tokens from {summary.text_bytes:,} decompressed bytes "
            f"({summary.bytes_read:,} input bytes as stored) in {summary.seconds:.1f} s",
        ]
    if summary.already_complete:
        head = f"{summary.output_dir} is already complete with these settings; nothing to do."
    else:
        head = f"wrote {summary.output_dir} ({summary.format})"
        if summary.resumed_units:
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
        lines.append(
            f"  this run: {summary.run_tokens:,} tokens from {summary.text_bytes:,} decompressed bytes "
            f"({summary.bytes_read:,} input bytes as stored) in {summary.seconds:.1f} s = "
            f"{summary.tokens_per_second:,.0f} tokens/s, {rate_text(summary.text_bytes, summary.seconds)} decompressed "
            "(start-up included, as on the bar)"
        )
    if summary.skipped:
        total = sum(summary.skipped.values())
        kinds = ", ".join(f"{kind} {count:,}" for kind, count in sorted(summary.skipped.items()))
        lines.append(f"  skipped {total:,} bad records: {kinds}")
        lines.extend(f"    e.g. {example}" for example in summary.examples)
    else:
        lines.append("  skipped 0 records")
    if summary.dropped:
        kinds = ", ".join(f"{kind} {count:,}" for kind, count in sorted(summary.dropped.items()))
        lines.append(
            f"  gpt-simple rule: {kinds} (short_text/no_tokens: documents dropped; blank_line/no_text_field: "
            "lines skipped; truncated: cut at 10,001 windows)"
        )
    return lines


@click.command(
    epilog="Example:\n\n\b\n  tokenloom tokenize --input-dir data/raw --output-dir data/tokens \\\n"
    "      --tokenizer ./my-tokenizer --max-length 2048 --overlap-size 128 --num-workers 8\n"
    "  tokenloom tokenize --input-dir data/raw --output-dir data/megatron --format megatron \\\n"
    "      --max-length 2048   # writes data/megatron/data.bin + data.idx",
)
@click.option(
    "--input-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory searched recursively (sorted by path) for .jsonl, .jsonl.gz, .jsonl.zst, .json.gz, .parquet "
    "and .arrow files (zstd, parquet, Arrow: the corpus extra); or an s3://, gs://, az:// prefix (credentials from "
    "AWS_*/GOOGLE_*/AZURE_* variables; each object fetched once into TOKENLOOM_CACHE_DIR when first read).",
)
@click.option(
    "--output-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Dataset directory to write; rerunning the same command resumes an interrupted run.",
)
@click.option(
    "--tokenizer",
    default=None,
    help="Hugging Face tokenizer directory or locally cached name. Default: the shipped stdlib BPE (16k).",
)
@click.option(
    "--seq-len",
    "--max-length",
    "seq_len",
    type=int,
    default=None,
    help="Longest entry in tokens, EOD included; longer documents are windowed. "
    "[default: none: every document is one entry, however long]",
)
@click.option(
    "--overlap-size",
    type=int,
    default=0,
    show_default=True,
    help="Tokens shared by consecutive windows (<= max-length / 2 under --windowing tokenloom).",
)
@click.option(
    "--windowing",
    type=click.Choice([w.value for w in Windowing]),
    default=Windowing.TOKENLOOM.value,
    show_default=True,
    help="tokenloom: every entry ends with EOD and holds at most --max-length tokens with it; no redundant tail "
    "windows; empty documents become [EOD]. gpt-simple: GPT-Simple's pretokenize exactly (EOD only where a window "
    "reaches the document's end, entries of up to --max-length + 1 tokens, its tail windows, documents of no "
    "tokens dropped, its uint16/uint32 choice); needs --max-length.",
)
@click.option(
    "--min-text-length",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="--windowing gpt-simple only: drop documents of fewer characters, as GPT-Simple's --min_text_length "
    "(its default is 200; pass the value of the run to reproduce).",
)
@click.option(
    "--num-workers",
    type=int,
    default=default_num_workers(),
    show_default=True,
    help="Encoding workers: threads of this process with the fast engine (up to 4), else processes "
    "(0: all on the calling thread). The output is the same for any count.",
)
@click.option(
    "--format",
    "format_",
    type=click.Choice(SUPPORTED_FORMATS + RECORD_FORMATS),
    default="native",
    show_default=True,
    help="Output format. native: OUT/unit_UUUUUU_KKKK.bin/.idx + manifest.json. megatron: the prefix OUT/data "
    "(OUT/data.bin + OUT/data.idx). packed: OUT/data.pbin. flat: OUT/shard_NNNNN.npy + manifest.json. "
    "megatron/packed also get OUT/tokenize.json (tokenizer fingerprint, inputs, settings). Non-native formats "
    "are tokenized into the native staging dataset OUT.native-staging (resumable), then converted; the staging "
    "is removed once OUT is published. These formats cannot store overlap prefixes: --overlap-size > 0 is refused "
    "unless --drop-overlap-prefix.",
)
@click.option(
    "--drop-overlap-prefix",
    is_flag=True,
    help="megatron/flat/packed: accept --overlap-size > 0 and drop the overlap-prefix lengths "
    "(the repeated tokens are then not masked by the loss).",
)
@click.option("--keep-staging", is_flag=True, help="megatron/flat/packed: keep OUT.native-staging after publishing.")
@click.option(
    "--text-field",
    default="text",
    show_default=True,
    help="Field (parquet/Arrow: column) with the text; a dotted path for nested fields (struct columns).",
)
@click.option(
    "--shard-size-tokens",
    type=int,
    default=100_000_000,
    show_default=True,
    help="Close a shard once it holds this many tokens.",
)
@click.option(
    "--on-error",
    type=click.Choice([e.value for e in OnError]),
    default="raise",
    show_default=True,
    help="A bad record stops the run (raise) or is counted and skipped (skip).",
)
@click.option("--overwrite", is_flag=True, help="Replace an output directory written with other settings.")
@click.option(
    "--eos-id", type=int, default=None, help="End-of-document id, required if the tokenizer has no EOS token."
)
@click.option("--max-line-bytes", type=int, default=64 << 20, show_default=True, help="Longer lines are bad records.")
@click.option("--hash-inputs", is_flag=True, help="Identify inputs by content hash rather than size + mtime.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar on stderr.")
@click.option(
    "--engine",
    type=click.Choice([e.value for e in Engine]),
    default="auto",
    show_default=True,
    help="Encoding engine. hf: Hugging Face tokenizers. fast: fastokens (an error unless it loads the tokenizer "
    "and gives the same ids as hf on a probe set plus the first documents). auto: fast when that holds, else hf. "
    "The output is the same bytes with either.",
)
@click.option(
    "--verify-fraction",
    type=click.FloatRange(0.0, 1.0),
    default=DEFAULT_VERIFY_FRACTION,
    show_default=True,
    help="With the fast engine, re-encode this fraction of documents (by content hash) with hf and stop on a "
    "difference.",
)
@click.option(
    "--num-nodes",
    type=int,
    default=None,
    help="Processes (machines) sharing this run; each takes the input files (units) u with u % N == R, commits "
    "each unit atomically, and the last to finish writes the manifest. The output is the same bytes for any N. "
    "[default: SLURM_ARRAY_TASK_COUNT, else SLURM_NTASKS, else a single-process run]",
)
@click.option(
    "--node-rank",
    type=int,
    default=None,
    help="This process's rank in [0, --num-nodes). [default: SLURM_ARRAY_TASK_ID, else SLURM_PROCID, else 0]",
)
@click.option(
    "--executor",
    type=click.Choice([e.value for e in ExecutorKind]),
    default=ExecutorKind.LOCAL.value,
    show_default=True,
    help="local: this process and its --num-workers pool. ray: every unit as a Ray task on the cluster at "
    '--ray-address (pip install "tokenloom-tokenize[ray]"); the same output bytes. With an s3://, gs://, az:// '
    "--input-dir or --output-dir, each task fetches its unit's input and uploads its unit from its own machine "
    "(its TOKENLOOM_CACHE_DIR); --layout tree and --val-fraction do not run under ray yet.",
)
@click.option(
    "--layout",
    type=click.Choice([v.value for v in Layout]),
    default=Layout.FLAT.value,
    show_default=True,
    help="tree: IN/<split>/<bucket>/... becomes the datasets OUT/<split>/<bucket>/ in one run (one tokenizer load, "
    "one worker pool): the layout curriculum reads. flat: one dataset from every file under IN.",
)
@click.option(
    "--val-fraction",
    type=click.FloatRange(0.0, 1.0, max_open=True),
    default=0.0,
    show_default=True,
    help="Carve this fraction of the training documents into a validation split, chosen by an xxh3-64 hash of "
    "each document's text seeded with --seed (the same documents on any machine or worker count): OUT/train + "
    "OUT/val, or with --layout tree OUT/val/<bucket> beside OUT/train/<bucket>.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the --val-fraction document hash.")
@click.option(
    "--unit-bytes",
    type=click.IntRange(min=1),
    default=DEFAULT_UNIT_BYTES,
    show_default=True,
    help="With --num-nodes / --executor ray: an uncompressed .jsonl larger than this is cut into units of line-"
    "aligned byte ranges, a parquet file into runs of row groups, so one big file spreads over nodes. Compressed "
    ".jsonl.gz / .jsonl.zst / .json.gz and Arrow files are always whole-file units (a compressed stream cannot be "
    "entered in the middle).",
)
@click.option("--ray-address", default=None, help="--executor ray: the head's HOST:PORT. [default: RAY_ADDRESS]")
@click.option(
    "--train-type",
    type=click.Choice(TRAIN_TYPES),
    default=None,
    help="Post-training records instead of text: sft ({messages} or {prompt, completion}), dpo ({prompt, chosen, "
    "rejected}) or grpo ({prompt, responses, rewards}), rendered with the chat template, loss masks derived and "
    "verified per record, written to a record store (--format bin-meta, or h5: AstrAI's H5 layout, OUT/data.h5); "
    "one unit-planned run at any node count.",
)
@click.option(
    "--chat-template",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="--train-type: a Jinja chat template file replacing the tokenizer's own.",
)
@click.option(
    "--train-roles",
    default="assistant",
    show_default=True,
    help="--train-type: the roles whose turns are trained, comma-separated.",
)
@click.option(
    "--truncate",
    type=click.Choice(["skip", "keep-start", "keep-end"]),
    default="skip",
    show_default=True,
    help="--train-type: a record over --max-length is skipped and counted (never a silent cut), or cut.",
)
@click.option(
    "--astrai-config",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    default=None,
    help="AstrAI's preprocessing config (pipeline.json): the sequence, loss_mask and position_ids AstrAI's Pipeline "
    "writes for its sft and pretrain configs (per-message rendering, role masks, max_seq_len, truncation_mode).",
)
@click.option(
    "--finalize",
    is_flag=True,
    help="Only write the manifest of a --num-nodes run whose units are all committed (when no node could).",
)
def tokenize(
    input_dir: Path,
    output_dir: Path,
    tokenizer: str | None,
    seq_len: int | None,
    overlap_size: int,
    windowing: str,
    min_text_length: int,
    num_workers: int,
    format_: str,
    drop_overlap_prefix: bool,
    keep_staging: bool,
    text_field: str,
    shard_size_tokens: int,
    on_error: str,
    overwrite: bool,
    eos_id: int | None,
    max_line_bytes: int,
    hash_inputs: bool,
    progress: bool,
    engine: str,
    verify_fraction: float,
    num_nodes: int | None,
    node_rank: int | None,
    executor: str,
    unit_bytes: int,
    layout: str,
    val_fraction: float,
    seed: int,
    ray_address: str | None,
    finalize: bool,
    train_type: str | None,
    chat_template: Path | None,
    train_roles: str,
    truncate: str,
    astrai_config: Path | None,
) -> None:
    """Pre-tokenize jsonl (.gz, .zst), parquet and Arrow files into token shards, in parallel, crash-safely.

    Every entry ends with the tokenizer's EOS token. The output is byte-identical
    for any --num-workers; kill it at any moment and run the same command again
    to continue from the completed shards.
    """
    try:
        num_nodes, node_rank = _nodes(num_nodes, node_rank)
        config = TokenizeConfig(
            input_dir=input_dir,
            output_dir=output_dir,
            tokenizer=tokenizer,
            seq_len=seq_len,
            overlap_size=overlap_size,
            windowing=Windowing(windowing),
            min_text_length=min_text_length,
            num_workers=num_workers,
            format=format_,
            drop_overlap_prefix=drop_overlap_prefix,
            keep_staging=keep_staging,
            text_field=text_field,
            shard_size_tokens=shard_size_tokens,
            on_error=OnError(on_error),
            overwrite=overwrite,
            eos_id=eos_id,
            max_line_bytes=max_line_bytes,
            hash_inputs=hash_inputs,
            engine=engine,
            verify_fraction=verify_fraction,
            num_nodes=num_nodes,
            node_rank=node_rank,
            executor=ExecutorKind(executor),
            unit_bytes=unit_bytes,
            layout=Layout(layout),
            val_fraction=val_fraction,
            seed=seed,
            ray_address=ray_address,
            finalize=finalize,
            train_type=train_type or ("sft" if astrai_config else None),
            chat_template=chat_template,
            astrai_config=astrai_config,
            train_roles=tuple(r.strip() for r in train_roles.split(",") if r.strip()),
            truncate=truncate,
        )
        with progress_bar(input_dir, enabled=progress) as on_progress:
            summary = run_tokenize(config, on_progress=on_progress)
    except (DataError, OSError, ImportError) as exc:
        fail_command(exc)
    for line in _summary_lines(summary):
        click.echo(line)


def _record_lines(summary: TokenizeSummary) -> list[str]:
    stats = summary.post_training or {}
    if summary.units_total:
        head = (
            f"committed {summary.units_committed} unit(s) into {summary.output_dir}; {summary.units_missing} of "
            f"{summary.units_total} units are still to be committed by other nodes (the last one to finish "
            "publishes the store; or run the same command with --finalize once all are done)"
        )
    elif summary.already_complete:
        head = f"{summary.output_dir} is already complete with these settings; nothing to do."
    else:
        head = f"wrote {summary.output_dir} ({stats.get('train_type', 'records')} record store, {summary.format})"
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
@click.option(
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
        try:
            lines = len(build_index(path, full_hash=full_hash))
        except (DataError, OSError) as exc:
            fail_command(exc)
        click.echo(f"{index_path(path)}: {lines:,} lines")


@click.command(
    epilog="Example:\n\n\b\n  tokenloom pack data/train.jsonl --tokenizer ./my-tokenizer --output data/train.pbin"
)
@click.argument("input_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Default: FILE.pbin beside the input.",
)
@click.option(
    "--tokenizer",
    default=None,
    help="Hugging Face tokenizer directory or cached name. Default: the shipped stdlib BPE.",
)
@click.option(
    "--text-field", default="text", show_default=True, help="Field with the text; a dotted path for nested fields."
)
@click.option("--num-workers", type=int, default=default_num_workers(), show_default=True, help="Encoding processes.")
@click.option("--on-error", type=click.Choice([e.value for e in OnError]), default="raise", show_default=True)
@click.option(
    "--eos-id", type=int, default=None, help="End-of-document id, required if the tokenizer has no EOS token."
)
@click.option(
    "--engine",
    type=click.Choice([e.value for e in Engine]),
    default="auto",
    show_default=True,
    help="Encoding engine, as for tokenize: auto, hf or fast.",
)
@click.option("--legacy", is_flag=True, help="Write the old 8-byte-header layout (uint32 tokens).")
@click.option("--overwrite", is_flag=True, help="Replace an existing output file.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar on stderr.")
def pack(
    input_file: Path,
    output: Path | None,
    tokenizer: str | None,
    text_field: str,
    num_workers: int,
    on_error: str,
    eos_id: int | None,
    engine: str,
    legacy: bool,
    overwrite: bool,
    progress: bool,
) -> None:
    """Tokenize one jsonl file into a Modalities packed data file (.pbin).

    Each document becomes its tokens followed by EOD, in file order.
    """
    from tokenloom.tokenize._pack import pack as run_pack

    try:
        with progress_bar(input_file, enabled=progress, label="pack") as on_progress:
            summary = run_pack(
                input_file,
                output,
                tokenizer=tokenizer,
                text_field=text_field,
                num_workers=num_workers,
                on_error=on_error,
                eos_id=eos_id,
                legacy=legacy,
                overwrite=overwrite,
                on_progress=on_progress,
                engine=engine,
            )
    except (DataError, OSError, ImportError) as exc:
        fail_command(exc)
    click.echo(
        f"wrote {summary.output}: {summary.documents:,} documents, {summary.tokens:,} tokens, "
        f"dtype {summary.dtype}, eos_id {summary.eos_id}"
    )
    click.echo(
        f"  {summary.text_bytes:,} decompressed bytes ({summary.bytes_read:,} input bytes as stored) in "
        f"{summary.seconds:.1f} s = {summary.tokens_per_second:,.0f} tokens/s, "
        f"{rate_text(summary.text_bytes, summary.seconds)} decompressed (start-up included, as on the bar)"
    )
    click.echo(f"  engine {summary.engine}: {summary.engine_reason}")
    if summary.skipped:
        kinds = ", ".join(f"{kind} {count:,}" for kind, count in sorted(summary.skipped.items()))
        click.echo(f"  skipped {sum(summary.skipped.values()):,} bad records: {kinds}")
        for example in summary.examples:
            click.echo(f"    e.g. {example}")
