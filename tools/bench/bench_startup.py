"""Benchmark command start-up: wall time of ``tokenloom <sub> --help`` and ``tokenloom curriculum status DIR``.

Each command runs as a user runs it (the ``tokenloom`` console script of this environment), one fresh
process per run, against ``python -c pass`` in the same rounds (commands alternate round by round, so
drift in the machine's load falls on all alike). Figures are medians of 3 runs (``--quick``: 1), after
one unmeasured warm-up run of each command (bytecode written, files in the page cache). Target: under
1 s on a quiet 2-core machine.

    uv run --group bench python tools/bench/bench_startup.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUTPUT = REPO / "docs" / "benchmarks" / "startup.md"
RUNS = 3
TARGET_S = 1.0


def tokenloom_command() -> list[str]:
    """The console script next to this interpreter (as a user calls it), else ``python -m tokenloom.formats``."""
    script = Path(sys.executable).parent / "tokenloom"
    if script.exists():
        return [str(script)]
    found = shutil.which("tokenloom")
    return [found] if found else [sys.executable, "-m", "tokenloom.formats"]


def subcommands() -> list[list[str]]:
    """Every installed ``tokenloom`` subcommand (entry points; read without importing them)."""
    return [[ep.name] for ep in sorted(metadata.entry_points(group="tokenloom.commands"), key=lambda ep: ep.name)]


#: As run.py: child processes cache bytecode (Python's default), so this measures the code, not a cold cache.
_ENV = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}


def _time(argv: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, timeout=300, env=_ENV)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    return elapsed


def run(quick: bool) -> str:
    runs = 1 if quick else RUNS
    tokenloom = tokenloom_command()
    with tempfile.TemporaryDirectory() as work:
        run_dir = Path(work) / "run"
        run_dir.mkdir()
        (run_dir / "run_status.json").write_text(json.dumps({"status": "running", "step": 10}))
        rows: list[tuple[str, list[str]]] = [("`python -c pass`", [sys.executable, "-c", "pass"])]
        rows.append(("`tokenloom --help`", [*tokenloom, "--help"]))
        rows += [(f"`tokenloom {' '.join(sub)} --help`", [*tokenloom, *sub, "--help"]) for sub in subcommands()]
        rows.append(("`tokenloom curriculum status DIR`", [*tokenloom, "curriculum", "status", str(run_dir)]))
        for _, argv in rows:  # warm-up: bytecode and page cache
            _time(argv)
        times: list[list[float]] = [[] for _ in rows]
        for _ in range(runs):
            for i, (_, argv) in enumerate(rows):
                times[i].append(_time(argv))
    medians = [statistics.median(t) for t in times]
    baseline = medians[0]
    lines = [
        "## start-up",
        "",
        f"Wall time of one process, median of {runs} run(s) after a warm-up run, commands alternating round by "
        "round; `tokenloom` is this environment's console script. A command that does not train imports no torch "
        "(checked by `tools/checks/startup_check.py`)." + (" QUICK smoke run." if quick else ""),
        "",
        "| command | time | minus `python -c pass` | target |",
        "|---|---|---|---|",
        f"| `python -c pass` | {baseline:.2f} s | | |",
    ]
    for (label, _), median in zip(rows[1:], medians[1:], strict=True):
        verdict = "" if median < TARGET_S else " (over)"
        lines.append(f"| {label} | {median:.2f} s | {median - baseline:+.2f} s | < {TARGET_S:.0f} s{verdict} |")
    lines.append("")
    markdown = "\n".join(lines)
    if not quick:
        OUTPUT.parent.mkdir(parents=True, exist_ok=True)
        OUTPUT.write_text(markdown)
    return markdown


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(run(args.quick))


if __name__ == "__main__":
    main()
