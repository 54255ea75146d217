"""``tokenloom validate``, ``inspect`` and ``convert`` (entry points of tokenloom-formats)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import click
import orjson

from tokenloom.formats._convert import DEFAULT_CHUNK_TOKENS, _accepts, convert_dataset
from tokenloom.formats._dataset import TokenDataset
from tokenloom.formats._registry import available_formats, open_dataset, writer_spec
from tokenloom.formats.cli.deep import deep_open
from tokenloom.formats.cli.group import cli_errors, option
from tokenloom.formats.cli.remote_options import PATH_OR_URL, remote_kwargs, remote_options
from tokenloom.formats.cli.summary import config_snippet, describe, length_percentiles
from tokenloom.formats.errors import ConfigError, DataError
from tokenloom.formats.flat import FILE_FORMATS
from tokenloom.formats.io.manifest import MANIFEST_NAME, add_block_hashes, read_manifest
from tokenloom.formats.io.optional import require
from tokenloom.formats.io.safety import dataset_inputs, unlisted_files
from tokenloom.formats.io.storage import check_readable
from tokenloom.formats.io.urls import refuse_remote_output
from tokenloom.formats.keyed.records import is_record_store, open_records, write_record_manifest
from tokenloom.formats.keyed.store import TOKEN_KEYS
from tokenloom.formats.native.writer import adopt_native

__all__ = ["convert", "inspect", "validate"]

DEFAULT_SEQ_LEN = 2048

_format_option = option(
    "--format",
    "format_name",
    default=None,
    metavar="NAME",
    help="The format, if detection is not enough (see `tokenloom convert --help` for the names).",
)
_dtype_option = option(
    "--dtype",
    default=None,
    metavar="DTYPE",
    help="Token dtype, for raw shards that do not declare one ('infer' guesses).",
)


def _summary_lines(facts: dict[str, Any]) -> list[str]:
    def show(value: Any) -> str:
        if value is None:
            return "unknown"
        return f"{value:,}" if isinstance(value, int) else str(value)

    rows = [
        ("format", facts["format"]),
        ("path", facts["path"]),
        ("shards", facts["shards"]),
        ("entries", facts["entries"]),
        ("documents", facts.get("documents")),
        ("tokens", facts["tokens"]),
        ("dtype", facts["dtype"]),
        ("vocab", facts["vocab_size"]),
        ("eos id", facts["eos_id"]),
    ]
    return [f"{name:<10} {show(value)}" for name, value in rows]


def _eos_id_option(help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return option("--eos-id", type=click.IntRange(min=0), default=None, help=help_text)


def _vocab_size_option(help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return option("--vocab-size", type=click.IntRange(min=1), default=None, help=help_text)


@click.command(
    epilog="\b\nExamples:\n  tokenloom validate data/tokens --deep --seq-len 4096\n"
    "  tokenloom validate shards/ --format flat --dtype uint16\n"
    "  tokenloom validate out/data --deep --vocab-size 50257 --eos-id 50256   # Megatron records neither\n"
    "  tokenloom validate data/tokenized/train/web --write-manifest   # adopt GPT-Simple shards\n"
    "  tokenloom validate --curriculum curriculum.yaml --global-batch-size 512 --max-steps 20000\n"
    "  tokenloom validate s3://bucket/tokens --deep --storage-option region=eu-west-1   # AWS_* credentials",
)
@click.argument("path", type=PATH_OR_URL)
@option("--deep", is_flag=True, help="Also verify every checksum, token id < vocab size and EOS placement.")
@option("--seq-len", type=click.IntRange(min=1), default=None, help=f"Window length [default: {DEFAULT_SEQ_LEN}].")
@_vocab_size_option("--deep: check token ids against this vocab size (needed where the format records none).")
@_eos_id_option("--deep: check that every entry ends with this id (needed where the format records none).")
@_format_option
@_dtype_option
@option(
    "--progress/--no-progress",
    default=True,
    help="--deep: a percentage bar with ETA per stage on stderr (only when stderr is a terminal).",
)
@option("--curriculum", is_flag=True, help="PATH is a curriculum config (needs tokenloom-curriculum).")
@option("--global-batch-size", type=click.IntRange(min=1), default=None, help="With --curriculum: budget check.")
@option("--max-steps", type=click.IntRange(min=1), default=None, help="With --curriculum: budget check.")
@option(
    "--write-manifest",
    is_flag=True,
    help="Adopt a native directory without manifest.json (GPT-Simple's): checksum every file and write one "
    "(recording --vocab-size / --eos-id when given). On a dataset whose manifest has no block hashes "
    "(written before they were recorded): check every data file and add them.",
)
@remote_options
def validate(
    path: Path | str,
    deep: bool,
    seq_len: int | None,
    vocab_size: int | None,
    eos_id: int | None,
    format_name: str | None,
    dtype: str | None,
    write_manifest: bool,
    progress: bool = True,
    curriculum: bool = False,
    global_batch_size: int | None = None,
    max_steps: int | None = None,
    storage_option: tuple[str, ...] = (),
    block_cache_dir: Path | None = None,
) -> None:
    """Check a token dataset (or, with --curriculum, a curriculum config) and print the config snippet.

    Exits 0 when the dataset is clean and 1 when a problem was found (the
    message names the file, offset and field, and what to do). Fast validation
    checks the layout, sizes and that every file can be read; --deep also reads
    every token. A curriculum also exits 2 on warnings only.
    """
    if curriculum:  # validators come from the packages that own them (entry point group tokenloom.validators)
        validators = {ep.name: ep for ep in entry_points(group="tokenloom.validators")}
        if "curriculum" not in validators:
            raise click.ClickException("--curriculum needs tokenloom-curriculum: pip install tokenloom-curriculum")
        check = validators["curriculum"].load()
        raise SystemExit(check(path, global_batch_size=global_batch_size, max_steps=max_steps))
    coverage: list[str] = []
    warnings: list[str] = []
    lines: list[str] = []
    dataset: TokenDataset | None = None
    try:
        remote = remote_kwargs(path, storage_option, block_cache_dir)
        if write_manifest:
            refuse_remote_output(path, "manifest write (--write-manifest)")
            if (Path(path) / MANIFEST_NAME).is_file():
                _, added = add_block_hashes(path, read_manifest(path))
                done = f"added block hashes of {added} files" if added else "block hashes already recorded"
                click.echo(f"{Path(path) / MANIFEST_NAME}: {done}; remote reads verify every block", err=True)
            elif is_record_store(path) or Path(path).is_file():  # sft / dpo / grpo: checked deep before its files
                # are blessed (a lone file, FILE.h5 say: a ConfigError naming the directory to pass)
                sealed = write_record_manifest(path, validate="deep", vocab_size=vocab_size, eos_id=eos_id)
                click.echo(
                    f"wrote {Path(path) / MANIFEST_NAME}: checksums and block hashes of {len(sealed.files)} files "
                    f"of a record store ({sealed.num_documents:,} records); later opens and remote reads verify them",
                    err=True,
                )
            else:
                with _quiet("tokenloom.formats"):  # its info "no manifest: run --write-manifest" hint, now moot
                    adopted = adopt_native(path, vocab_size=vocab_size, eos_id=eos_id)
                click.echo(
                    f"wrote {Path(path) / MANIFEST_NAME}: checksums of {len(adopted.files)} files; later opens "
                    "verify them",
                    err=True,
                )
        if not remote and _keyed_format(format_name) and is_record_store(Path(path)):
            lines = _record_lines(Path(path), deep)  # its manifest checked; deep: every file
            if (Path(path) / "sequence.bin").exists():  # sft: a token stream too, summarised as one below
                lines = []
        if lines:
            pass
        elif deep:
            dataset, coverage = deep_open(path, format_name, dtype, progress, vocab_size, eos_id, remote)
        else:
            dataset = open_dataset(path, format=format_name, dtype=dtype, validate="fast", **remote)
        if not remote and dataset is not None:  # a URL's objects were listed and their bytes come from the store
            check_readable(p for p in dataset_inputs(dataset) if p.is_file())  # fast validation reads no tokens
            warnings = unlisted_files(dataset)
    except (DataError, OSError) as exc:
        click.echo(f"{'path':<10} {path}")
        click.echo(f"{'problems':<10} 1")
        click.echo(f"  {type(exc).__name__}: {exc}")
        raise SystemExit(1) from None
    if dataset is None:  # a record store without a token key: no token-dataset view, no config snippet
        click.echo("\n".join([*lines, f"{'problems':<10} none ({'deep' if deep else 'fast'} validation)"]))
        return
    for line in _summary_lines(describe(dataset)):
        click.echo(line)
    for line in coverage:
        click.echo(f"{'checked':<10} {line}")
    for line in warnings:
        click.echo(f"{'warning':<10} {line}")
    click.echo(f"{'problems':<10} none ({'deep' if deep else 'fast'} validation)")
    click.echo("")
    window = seq_len or DEFAULT_SEQ_LEN
    note = "" if seq_len else "  (default; pass --seq-len)"
    if note:
        click.echo(f"# seq_len {window}{note}")
    click.echo(config_snippet(dataset, window))


def _record_lines(path: Path, deep: bool) -> list[str]:
    """The summary of a record store (opened with its manifest's checks; deep: every checksum and float)."""
    store = open_records(path, validate="deep" if deep else "fast")
    tokens = sum(part.lengths[key] for part in store.parts for key in part.files if key in TOKEN_KEYS)
    return [
        f"{'format':<10} {_store_format(path)} (record store)",
        f"{'path':<10} {path}",
        f"{'records':<10} {len(store):,}",
        f"{'tokens':<10} {tokens:,}",
        f"{'keys':<10} {', '.join(store.keys)}",
        f"{'manifest':<10} {'yes' if (path / MANIFEST_NAME).is_file() else 'none (--write-manifest writes one)'}",
    ]


def _keyed_format(name: str | None) -> bool:
    """Whether ``--format`` leaves a record store to be read as one: none given, or a format with a keyed store."""
    spec = available_formats().get(name) if name is not None else None
    return name is None or (spec is not None and spec.store is not None)


def _store_format(path: Path) -> str:
    """The name of the registered format whose keyed store holds the record store at ``path``."""
    return next(s.name for s in available_formats().values() if s.store is not None and s.store.detect(path))


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """Drop one logger's records below WARNING for the block."""
    target = logging.getLogger(logger)
    level = target.level
    target.setLevel(logging.WARNING)
    try:
        yield
    finally:
        target.setLevel(level)


@click.command(
    epilog="\b\nExamples:\n  tokenloom inspect data/tokens --json\n  tokenloom inspect data/tokens --plot lengths.png\n"
    "  tokenloom inspect gs://bucket/tokens --block-cache-dir /local/nvme/cache\n"
    "  tokenloom inspect out/sft --records 3       # post-training records, trained spans highlighted"
)
@click.argument("path", type=PATH_OR_URL)
@option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write a PNG histogram of entry lengths, log count axis (needs the 'plot' extra).",
)
@option(
    "--records",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Show the first N records of a record store (sft/dpo/grpo) with trained spans highlighted.",
)
@option(
    "--tokenizer",
    default=None,
    metavar="DIR",
    help="With --records: decode with this tokenizer (default: the one the store was written with).",
)
@_format_option
@_dtype_option
@remote_options
def inspect(
    path: Path | str,
    as_json: bool,
    plot: Path | None,
    format_name: str | None,
    dtype: str | None,
    storage_option: tuple[str, ...] = (),
    block_cache_dir: Path | None = None,
    records: int | None = None,
    tokenizer: str | None = None,
) -> None:
    """Counts, dtype and document-length percentiles of a token dataset (a directory, a file or a URL)."""
    if records is not None:
        from tokenloom.formats.cli.records_view import record_facts, show_records

        with cli_errors():
            if not isinstance(path, Path):
                raise ConfigError("--records reads a local record store", field="records")
            facts = record_facts(path, records, tokenizer)
        if as_json:
            click.echo(orjson.dumps(facts, option=orjson.OPT_INDENT_2).decode())
        else:
            show_records(facts)
        return
    with cli_errors():
        pyplot = _pyplot() if plot is not None else None
        remote = remote_kwargs(path, storage_option, block_cache_dir)
        dataset = open_dataset(path, format=format_name, dtype=dtype, validate="fast", **remote)
    facts = describe(dataset)
    lengths = dataset.doc_lengths
    facts["lengths"] = length_percentiles(lengths)
    if plot is not None and pyplot is not None:
        _histogram(pyplot, lengths, plot, title=f"{facts['format']}: {facts['path']}")
        facts["plot"] = str(plot)
    if as_json:
        click.echo(orjson.dumps(facts, option=orjson.OPT_INDENT_2).decode())
        return
    for line in _summary_lines(facts):
        click.echo(line)
    stats = facts["lengths"]
    click.echo(
        "lengths    " + "  ".join(f"{k} {v:,.0f}" if k != "mean" else f"mean {v:,.1f}" for k, v in stats.items())
    )
    if plot is not None:
        click.echo(f"plot       {plot}")


def _pyplot() -> Any:
    matplotlib = require("matplotlib", distribution="tokenloom-formats", extra="plot", purpose="inspect --plot")
    matplotlib.use("Agg")
    return require("matplotlib.pyplot", distribution="tokenloom-formats", extra="plot", purpose="inspect --plot")


def _histogram(pyplot: Any, lengths: Any, path: Path, *, title: str) -> None:
    """Entry lengths on a log count axis (like the demo's plot): the long tail stays visible."""
    figure, axes = pyplot.subplots(figsize=(7, 4))
    axes.hist(lengths, bins=min(60, max(1, len(set(lengths.tolist()[:100_000])))), color="#3a6ea5")
    axes.set_yscale("log")
    axes.set_xlabel("entry length (tokens)")
    axes.set_ylabel("entries (log scale)")
    axes.set_title(f"{title}\n{len(lengths):,} entries", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def _verify_recorded_checksums(dataset: TokenDataset, source: Path | str, remote: dict) -> None:
    """Every file's xxh3 against the source's manifest, where it has one: a damaged shard is not copied."""
    if remote:  # a URL: deep validation reads every block and checks the manifest's checksums
        open_dataset(source, format=dataset.format, validate="deep", **remote)
        return
    root = dataset.root
    if root.is_dir() and (root / MANIFEST_NAME).is_file():
        read_manifest(root).verify(root, deep=True)


@click.command(
    epilog=(
        "\b\nExamples:\n"
        "  tokenloom convert data/native out/train_text_document --to megatron\n"
        "  tokenloom convert out/train_text_document data/native2 --to native --shard-size-tokens 100000000\n"
        "  tokenloom convert kf_shards/ data/native --to native --from flat --from-dtype uint32\n"
        "  tokenloom convert megatron/data data/native --to native --eos-id 50256 --vocab-size 50257\n"
        "  tokenloom convert s3://bucket/tokens data/megatron/train --to megatron   # AWS_* credentials"
    ),
)
@click.argument("source", type=PATH_OR_URL)
@click.argument("target", type=PATH_OR_URL)
@option("--to", "to", required=True, metavar="FORMAT", help="Target format (native, flat, megatron, ...).")
@option("--from", "from_format", default=None, metavar="FORMAT", help="Source format, if detection is not enough.")
@option("--from-dtype", default=None, metavar="DTYPE", help="Source dtype, for raw shards that do not declare one.")
@option("--dtype", default=None, metavar="DTYPE", help="Target dtype (default: the source's).")
@option(
    "--shard-size-tokens", type=click.IntRange(min=1), default=None, help="Target shard size, where the format shards."
)
@option("--overwrite", is_flag=True, help="Replace an existing target.")
@option("--legacy", is_flag=True, help="packed: write the legacy 8-byte-header layout (4-byte tokens).")
@option(
    "--file-format",
    type=click.Choice(FILE_FORMATS),
    default=None,
    help="flat: write .npy shards (default) or raw .bin shards.",
)
@option("--drop-overlap-prefix", is_flag=True, help="Allow targets that cannot store overlap prefixes to drop them.")
@option(
    "--chunk-tokens",
    type=click.IntRange(min=1),
    default=DEFAULT_CHUNK_TOKENS,
    help="Tokens per write batch (bounds memory).",
)
@option(
    "--verify/--no-verify",
    default=True,
    help="Check every file of the source against the checksums its manifest records (where it has one): a "
    "damaged source is an error, not silently copied. --no-verify skips that extra read.",
)
@_eos_id_option("End-of-document id to record, where the source has none (Megatron or .pbin from another tool).")
@_vocab_size_option("Vocab size to record (and check every token against), where the source has none.")
@option("--no-progress", is_flag=True, help="Do not show the progress bar.")
@remote_options
def convert(
    source: Path | str,
    target: Path | str,
    to: str,
    from_format: str | None,
    from_dtype: str | None,
    verify: bool,
    no_progress: bool,
    storage_option: tuple[str, ...] = (),
    block_cache_dir: Path | None = None,
    **options: Any,
) -> None:
    """Convert a token dataset to another format, losslessly and in constant memory.

    Entries, their order and overlap prefixes are kept where the target can store
    them. EOS id, vocab size and tokenizer fingerprint travel along: in the manifest
    (native, flat) or in a sidecar NAME.tokenloom.json (megatron, packed). --eos-id
    and --vocab-size set them where the source records none.
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

    with cli_errors():
        factory = writer_spec(to, field="--to").writer
        writer_options = {}
        for name in ("overwrite", "shard_size_tokens", "legacy", "file_format"):  # what only some writers take
            if value := options.pop(name):
                if not _accepts(factory, name):  # type: ignore[arg-type]
                    raise ConfigError(f"--{name.replace('_', '-')} is not an option of the {to} writer", field=name)
                writer_options[name] = value
        remote = remote_kwargs(source, storage_option, block_cache_dir)
        dataset = open_dataset(source, format=from_format, dtype=from_dtype, validate="fast", **remote)
        if verify:
            _verify_recorded_checksums(dataset, source, remote)
        progress = Progress(
            TextColumn(f"{dataset.format} -> {to}"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.completed:,}/{task.total:,} tokens"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            disable=no_progress,
            transient=True,
        )
        with progress:
            task = progress.add_task("convert", total=dataset.num_tokens)
            result = convert_dataset(
                dataset,
                target,
                to=to,
                writer_options=writer_options,
                on_progress=lambda n: progress.advance(task, n),
                **options,  # dtype, drop_overlap_prefix, chunk_tokens, eos_id, vocab_size
            )
    rate = result.tokens / result.seconds / 1e6 if result.seconds > 0 else float("inf")
    click.echo(
        f"converted {result.entries:,} entries, {result.tokens:,} tokens from {result.source_format} "
        f"to {result.target_format} in {result.seconds:.2f} s ({rate:,.1f} M tokens/s): {target}"
    )
