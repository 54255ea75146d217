"""``tokenloom eval-cache``: build an eval set's cache ahead of the training job (no torch.distributed)."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from tokenloom.eval_broadcast._cache import CachedRows, cache_entry, cache_settings, remove_stale_scratch, verify_cache
from tokenloom.eval_broadcast.errors import EvalBuildError
from tokenloom.formats import ConfigError, DataError, MissingFileError
from tokenloom.formats.io import MANIFEST_NAME, is_remote_url, real_path

__all__ = ["eval_cache"]

log = logging.getLogger("tokenloom.eval_broadcast")


@contextlib.contextmanager
def _progress(source: Any, enabled: bool) -> Iterator[None]:
    from tokenloom.eval_broadcast._sources import HFEvalSource

    if not enabled or not isinstance(source, HFEvalSource):
        yield
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn("tokenizing"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), transient=True
    ) as bar:
        task = bar.add_task("documents", total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        source.on_progress = update
        yield


@click.command(
    "eval-cache",
    epilog="Examples:\n\n\b\n"
    "  tokenloom eval-cache --data-files val.jsonl --tokenizer ./tok --seq-len 2048 --cache-dir /scratch/eval\n"
    "  tokenloom eval-cache --path data/val/books --seq-len 2048 --cache-dir /scratch/eval\n\n"
    "A training job that calls broadcast_eval_set with the same source, seq_len and cache_dir then "
    "broadcasts from this cache without tokenizing.",
)
@click.option(
    "--path",
    default=None,
    help="A token dataset open_dataset reads: a directory, or a URL (s3://, gs://, az://, https://; credentials "
    "from the environment, blocks cached in $TOKENLOOM_CACHE_DIR).",
)
@click.option("--name", default="json", show_default=True, help="load_dataset builder or name (with --data-files).")
@click.option("--data-files", multiple=True, help="Local data files of the split (repeatable).")
@click.option("--config", default=None, help="Dataset configuration name.")
@click.option("--split", default="train", show_default=True, help="The split holding the eval texts.")
@click.option("--text-field", default="text", show_default=True, help="The text column.")
@click.option("--tokenizer", default=None, help="A saved Hugging Face tokenizer directory.")
@click.option("--revision", default=None, help="Hub revision of the dataset (pin it for a stable cache key).")
@click.option(
    "--skip-empty/--keep-empty",
    default=None,
    help="Skip texts that encode to no tokens (KempnerForge) or keep each as a lone EOS "
    "[default: keep; skip with --compat kempnerforge]. Part of the cache key.",
)
@click.option(
    "--compat",
    type=click.Choice(["kempnerforge"]),
    default=None,
    help="The seed's defaults (kempnerforge: skip empty).",
)
@click.option("--seq-len", type=int, required=True, help="Rows hold seq_len + 1 tokens.")
@click.option("--drop-remainder", is_flag=True, help="Drop a last partial row instead of padding it.")
@click.option(
    "--cache-dir", type=click.Path(file_okay=False, path_type=Path), required=True, help="The eval-set cache."
)
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar.")
def eval_cache(
    path: str | None,
    name: str,
    data_files: tuple[str, ...],
    config: str | None,
    split: str,
    text_field: str,
    tokenizer: str | None,
    revision: str | None,
    skip_empty: bool | None,
    compat: str | None,
    seq_len: int,
    drop_remainder: bool,
    cache_dir: Path,
    progress: bool,
) -> None:
    """Build (or verify) the cached eval set of a Hugging Face split or a token dataset."""
    from tokenloom.eval_broadcast._sources import HFEvalSource, PathEvalSource

    try:
        local_sources = [Path(f) for f in data_files]
        if path is not None and not is_remote_url(path):  # a URL never holds the local cache
            if not os.path.lexists(path):
                raise MissingFileError(f"--path {path} does not exist", path=path, field="path")
            local_sources = [Path(path)]
        _check_cache_dir(cache_dir, local_sources)
    except DataError as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc
    if path is not None:
        source: Any = PathEvalSource(path)
    elif tokenizer is None:
        raise click.UsageError("give --path, or a Hugging Face split with --tokenizer (and --data-files / --name)")
    else:
        source = HFEvalSource(
            name,
            config,
            split=split,
            tokenizer=tokenizer,
            text_field=text_field,
            data_files=list(data_files) or None,
            revision=revision,
            skip_empty=skip_empty,
            compat=compat,
        )
    if not progress and isinstance(source, HFEvalSource):
        with contextlib.suppress(ImportError):  # --no-progress silences the datasets library's own bars too
            import datasets

            datasets.disable_progress_bars()
    try:
        key, cached = _cached(source, seq_len, drop_remainder, cache_dir)
        if cached is not None:
            _summary("already cached, verified", cached.path, len(cached.rows), cached.rows.shape[1],
                     cached.num_tokens, cached.tail_padding, str(cached.rows.dtype), cached.eos_id)  # fmt: skip
            return
        from tokenloom.eval_broadcast._broadcast import broadcast_eval_set  # a build: torch from here on

        with _progress(source, progress):
            evalset = broadcast_eval_set(
                source, seq_len=seq_len, drop_remainder=drop_remainder, cache_dir=cache_dir, cache_key=key
            )
    except DataError as exc:
        cause = exc.__cause__ if isinstance(exc, EvalBuildError) else None
        if isinstance(cause, DataError):  # one process: the source's own error says more than the wrapper
            exc = cause
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc
    verb = "already cached, verified" if evalset.origin == "cache" else "built and cached"
    _summary(verb, evalset.cache_path, len(evalset), evalset.row_len, evalset.num_tokens, evalset.tail_padding,
             str(evalset.rows.dtype).removeprefix("torch."), evalset.eos_id)  # fmt: skip


def _cached(source: Any, seq_len: int, drop_remainder: bool, cache_dir: Path) -> tuple[str | None, CachedRows | None]:
    """(the source's cache key, its verified cache entry or None), without torch: checking an existing cache
    reads and checksums it with numpy. Anything unusable is left to broadcast_eval_set, which discards and
    rebuilds it as before (and raises what a bad source raises)."""
    if isinstance(seq_len, bool) or seq_len < 1:
        return None, None
    try:
        key = source.fingerprint()
    except DataError:
        return None, None
    settings = cache_settings(seq_len=seq_len, vocab_size=None, eos_id=None, drop_remainder=drop_remainder)
    entry = cache_entry(cache_dir, key, **settings)
    if not (entry / MANIFEST_NAME).exists():
        return key, None
    remove_stale_scratch(cache_dir)  # what killed builds left behind, as a build would
    try:
        cached = verify_cache(entry)
    except (DataError, OSError, KeyError, TypeError, ValueError):
        return key, None
    log.info("eval set read from the cache %s", entry)
    return key, cached


def _summary(verb: str, path: Any, rows: int, row_len: int, tokens: int, padding: int, dtype: str, eos: Any) -> None:
    click.echo(f"{verb}: {path}")
    click.echo(f"  rows {rows:,} x {row_len}  tokens {tokens:,}  padding {padding}  dtype {dtype}  eos_id {eos}")


def _check_cache_dir(cache_dir: Path, sources: list[Path]) -> None:
    """The cache must not be, or lie inside, what it caches: its entries would land in the source data."""
    real_cache = real_path(cache_dir)
    for source in sources:
        real_source = real_path(source)
        if real_cache == real_source or real_source in real_cache.parents:
            raise ConfigError(
                f"--cache-dir {cache_dir} {'is' if real_cache == real_source else 'lies inside'} the source {source}",
                path=cache_dir,
                field="cache_dir",
                hint="Choose a cache directory outside the data being read",
            )
