"""``tokenloom validate --deep``: the deep read with a bar per stage, and the checks given values stand in for."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from tokenloom.formats._dataset import TokenDataset
from tokenloom.formats._registry import open_dataset
from tokenloom.formats.io.progress import reporting
from tokenloom.formats.io.safety import dataset_inputs

__all__ = ["deep_open"]


def deep_open(
    path: Path | str,
    format_name: str | None,
    dtype: str | None,
    progress: bool,
    vocab_size: int | None,
    eos_id: int | None,
    remote: dict | None = None,
) -> tuple[TokenDataset, list[str]]:
    """Deep validation with a percentage bar and ETA per stage on stderr (a TTY only; --no-progress: none).

    On a URL every block is read (into the cache) and checked against the manifest's per-file checksums.
    """
    from rich.console import Console

    fast = open_dataset(path, format=format_name, dtype=dtype, validate="fast", **(remote or {}))
    if remote:
        message = f"deep validation of {fast.format} {path}: {fast.metadata.get('remote', {}).get('objects')} objects"
    else:
        files = [p for p in dataset_inputs(fast) if p.is_file()]
        total = sum(p.stat().st_size for p in files)
        message = f"deep validation of {fast.format} {path}: {total / 1e6:,.1f} MB in {len(files)} files"
    message += f" ({fast.num_tokens:,} tokens)"
    console = Console(stderr=True)
    started = time.perf_counter()
    with _stage_bars(console, enabled=progress and console.is_terminal) as on_progress:
        dataset = open_dataset(
            path, format=format_name, dtype=dtype, validate="deep", on_progress=on_progress, **(remote or {})
        )
        with reporting(on_progress):  # --vocab-size / --eos-id read the tokens once more
            coverage = _deep_checks(dataset, vocab_size, eos_id)
    if progress and console.is_terminal:
        console.print(f"{message}: {time.perf_counter() - started:.1f} s", style="dim")
    return dataset, coverage


class _StageBars:
    """A rich bar per stage of a deep read (checksums, token ids, EOS placement); call it as ``on_progress``."""

    units: ClassVar[dict[str, str]] = {"checksums": "bytes", "token ids": "tokens", "EOS placement": "entries"}

    def __init__(self, console: Any) -> None:
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

        self.progress = Progress(
            TextColumn("{task.description:<14}"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.completed:,}/{task.total:,} {task.fields[unit]}"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        self.tasks: dict[str, Any] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage not in self.tasks:
            self.tasks[stage] = self.progress.add_task(stage, total=total, unit=self.units.get(stage, "units"))
        self.progress.update(self.tasks[stage], completed=done, total=total)


@contextlib.contextmanager
def _stage_bars(console: Any, *, enabled: bool) -> Iterator[_StageBars | None]:
    """The bars while the block runs (None when disabled: no terminal, or --no-progress)."""
    if not enabled:
        yield None
        return
    bars = _StageBars(console)
    with bars.progress:
        yield bars


def _deep_checks(dataset: TokenDataset, vocab_size: int | None, eos_id: int | None) -> list[str]:
    """Token range and EOS placement with the given or recorded values; what was (not) checked, in words."""
    return [
        _check_with(dataset, "vocab_size", vocab_size, dataset.check_token_range, "token range: every id < {:,}"),
        _check_with(dataset, "eos_id", eos_id, dataset.check_eos_placement, "EOS placement: every entry ends with {}"),
    ]


_CHECK_WORDS = {  # field -> (the flag that gives it, how the result names a recorded value, what is not checked)
    "vocab_size": ("--vocab-size", "recorded vocab size", "token range not checked: the format records no vocab size"),
    "eos_id": ("--eos-id", "recorded EOS id", "EOS placement not checked: the format records no EOS id"),
}


def _check_with(dataset: TokenDataset, field: str, given: int | None, check: Callable[[], None], done: str) -> str:
    """Run ``check`` with ``given`` in place of the recorded ``field`` (restored after); what was checked, in words."""
    flag, recorded_as, missing = _CHECK_WORDS[field]
    recorded = getattr(dataset, field)
    if given is not None and given != recorded:
        setattr(dataset, field, given)
        try:
            check()
        finally:
            setattr(dataset, field, recorded)
        return f"{done.format(given)} ({flag})"
    if recorded is not None:
        return f"{done.format(recorded)} ({recorded_as})"
    return f"{missing}; pass {flag} N"
