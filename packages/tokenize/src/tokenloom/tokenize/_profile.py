"""Where a worker's time goes, when ``TOKENLOOM_PROFILE=DIR`` is set (off otherwise: one dict lookup per chunk).

Each worker process adds up ``perf_counter`` spans by name (parse, encode, window, ...) and the
time from its start to its first chunk, and rewrites ``DIR/worker-<pid>.json`` after every chunk
(so a pool shut down without ceremony still leaves its totals). ``summarize(DIR)`` adds the
workers up for tools/bench/bench_tokenize_prep.py --profile.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["ENV", "enabled", "flush", "restart", "span", "summarize"]

ENV = "TOKENLOOM_PROFILE"
_STARTED = time.perf_counter()
_TOTALS: dict[str, float] = {}


def restart() -> None:
    """A worker forked from the fork server starts its clock here (the module was imported in the server)."""
    global _STARTED
    _STARTED = time.perf_counter()


def enabled() -> bool:
    return bool(os.environ.get(ENV))


@contextlib.contextmanager
def span(name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        _TOTALS[name] = _TOTALS.get(name, 0.0) + time.perf_counter() - start


def add(name: str, value: float) -> None:
    _TOTALS[name] = _TOTALS.get(name, 0.0) + value


def flush() -> None:
    directory = os.environ.get(ENV)
    if not directory:
        return
    if "first_chunk_after_start" not in _TOTALS:
        _TOTALS["first_chunk_after_start"] = time.perf_counter() - _STARTED
        _TOTALS["first_chunk_cpu"] = time.process_time()  # CPU since this process started: imports, tokenizer
    _TOTALS["alive"] = time.perf_counter() - _STARTED
    _TOTALS["alive_cpu"] = time.process_time()
    path = Path(directory) / f"worker-{os.getpid()}.json"
    path.write_text(json.dumps(_TOTALS, sort_keys=True))


def summarize(directory: Path) -> str:
    """One line per worker: its spans in seconds, largest first."""
    lines = []
    for path in sorted(directory.glob("worker-*.json")):
        totals = json.loads(path.read_text())
        shown = ", ".join(f"{k} {v:.2f}" for k, v in sorted(totals.items(), key=lambda kv: -kv[1]))
        lines.append(f"{path.stem}: {shown}")
    return "\n".join(lines) or "(no worker spans: was TOKENLOOM_PROFILE set in the workers?)"
