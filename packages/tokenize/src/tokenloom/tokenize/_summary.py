"""What a tokenize run reports: its summary, and the progress callback it feeds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "EXAMPLES_PER_KIND",
    "ProgressCallback",
    "RunCounts",
    "TokenizeSummary",
    "rate",
    "report_progress",
    "summary_of_record",
]


def rate(amount: float, seconds: float) -> float:
    """The one definition of a run's rate: what this run processed over this run's wall time."""
    return amount / seconds if seconds > 0 else 0.0


#: How many example lines of each skipped-record kind a summary keeps.
EXAMPLES_PER_KIND = 3


@dataclass(slots=True, kw_only=True)
class RunCounts:
    """What a tokenize or pack run counted, and its rates over its wall time (``seconds``, start-up included)."""

    documents: int = 0
    tokens: int = 0
    seconds: float = 0.0
    skipped: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    dtype: str = ""
    eos_id: int = -1
    engine: str = ""
    """The encoding engine (hf or fast) of the last session that wrote this output."""
    engine_reason: str = ""
    bytes_read: int = 0
    """Bytes of the input files (as stored: compressed for .gz) this run read; the bar's fill counts the same."""
    text_bytes: int = 0
    """Bytes this run encoded, decompressed (jsonl lines; parquet text columns): the rate shown counts these."""

    @property
    def tokens_per_second(self) -> float:
        return rate(self.tokens, self.seconds)

    @property
    def bytes_per_second(self) -> float:
        return rate(self.bytes_read, self.seconds)

    @property
    def text_bytes_per_second(self) -> float:
        return rate(self.text_bytes, self.seconds)


@dataclass(slots=True, kw_only=True)
class TokenizeSummary(RunCounts):
    """What a run did (the CLI prints it)."""

    output_dir: Path
    entries: int = 0
    input_bytes: int = 0
    shards: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    """--windowing gpt-simple: documents dropped by its rule (short_text, no_tokens) or cut (truncated)."""
    resumed_units: int = 0
    already_complete: bool = False
    vocab_size: int = 0
    format: str = "native"  # the name of the format written
    run_tokens: int = 0
    """Tokens written by this run (a resumed run: not those of the shards it resumed after)."""
    units_committed: int = 0
    """A unit-planned run: the units this process (or its Ray tasks) committed."""
    units_total: int = 0
    """A unit-planned run not yet finalized: the plan's units (0 once the manifest is written)."""
    units_missing: int = 0
    """A unit-planned run not yet finalized: units that no node has committed yet."""
    post_training: dict[str, Any] | None = None
    """--train-type: records, tokens, trained tokens, truncated and skipped counts (post_training.json's stats)."""
    datasets: list[str] = field(default_factory=list)
    """--layout tree / --val-fraction: the datasets under output_dir (``train/web``, ...)."""

    @property
    def tokens_per_second(self) -> float:
        """This run's tokens (not those of the units it resumed after) over its wall time."""
        return rate(self.run_tokens, self.seconds)

    def add_session(self, session: Any) -> None:
        """Count what this process's session (``_unit_work.Session``) encoded: not the units it resumed after."""
        self.examples, self.run_tokens, self.units_committed = session.examples, session.tokens, session.units
        self.bytes_read, self.text_bytes = session.bytes_read, session.text_bytes


def summary_of_record(out: Path, record: dict[str, Any], **published: Any) -> TokenizeSummary:
    """A published output's summary from its run record (``tokenize`` metadata or tokenize.json) and ``published``
    (what its manifest says better: entries, tokens, shards, dtype, ...; plus seconds and format)."""
    engine = record.get("engine", {})
    eos_id = record.get("eos_id")
    facts = {
        "documents": int(record.get("documents", 0)),
        "entries": int(record.get("num_entries", 0)),
        "tokens": int(record.get("num_tokens", 0)),
        "input_bytes": int(record.get("input_bytes", 0)),
        "skipped": dict(record.get("skipped", {})),
        "dropped": dict(record.get("dropped", {})),
        "dtype": str(record.get("dtype", "")),
        "eos_id": -1 if eos_id is None else int(eos_id),
        "vocab_size": int(record.get("vocab_size") or 0),
        "engine": str(engine.get("name", "")),
        "engine_reason": str(engine.get("reason", "")),
    }
    return TokenizeSummary(output_dir=out, **{**facts, **published})


ProgressCallback = Callable[..., None]
"""``(documents, tokens, bytes on disk)`` since the last call; a callback whose attribute ``text_bytes`` is
True gets a fourth argument, the bytes of text (decompressed) those documents held (the progress bar's rate)."""


def report_progress(
    callback: ProgressCallback | None, documents: int, tokens: int, source_bytes: int, text_bytes: int
) -> None:
    """Call ``callback`` (if any) with what it takes: see :data:`ProgressCallback`."""
    if callback is None:
        return
    if getattr(callback, "text_bytes", False):
        callback(documents, tokens, source_bytes, text_bytes)
    else:
        callback(documents, tokens, source_bytes)
