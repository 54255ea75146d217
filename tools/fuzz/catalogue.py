"""Bad-input catalogue: every command and reader against bad inputs (not a CI test; results in docs/fuzz.md).

    uv run python tools/fuzz/catalogue.py                 # every case, a table, exit 1 on any failure
    uv run python tools/fuzz/catalogue.py -k convert      # cases whose name contains "convert"

Each row is (name, setup, command, expectation). ``setup`` builds the inputs in a fresh
directory; the command is a ``tokenloom`` command line run in this process (the real
root group, subcommands from the entry points), a real process (OS failures, the
writer lock, a missing extra), or a Python reader call. Expectations:

- ``error``: exit 1 or 2 and exactly one output line naming a DataError class
  (``Error: FormatError: ...``, or validate's ``  FormatError: ...``), no traceback;
  a Python call raises a DataError (of the named class when one is given);
- ``ok``: exit 0 (the call returns) and the case's own check of the result passes;
- ``extra``: a missing optional dependency, one line naming the pip command, exit 2.

Every case also names its sources: their bytes must be unchanged afterwards ("nothing
lost"). OS failures use a real tmpfs (ENOSPC, EROFS) and setpriv (EACCES) as root; where
mounting is impossible they are simulated with an OSError raised at the first write.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import _catalogue_base as base
import _catalogue_inputs
import _catalogue_os
import _catalogue_other
import _catalogue_w3_cache  # noqa: F401 - registers its rows on import
import _catalogue_w3_consumers  # noqa: F401 - registers its rows on import
import _catalogue_w3_curriculum  # noqa: F401 - registers its rows on import
import _catalogue_w3_evalsampler  # noqa: F401 - registers its rows on import
import _catalogue_w3_formats  # noqa: F401 - registers its rows on import
import _catalogue_w3_inputs  # noqa: F401 - registers its rows on import
import _catalogue_w3_nodes  # noqa: F401 - registers its rows on import
import _catalogue_w3_open  # noqa: F401 - registers its rows on import
import _catalogue_w3_prep  # noqa: F401 - registers its rows on import
import _catalogue_w3_remote  # noqa: F401 - registers its rows on import
import _catalogue_w3_review  # noqa: F401 - registers its rows on import
import _catalogue_w3_rformats  # noqa: F401 - registers its rows on import
import _catalogue_w3_stream  # noqa: F401 - registers its rows on import
import _catalogue_w3_streaming  # noqa: F401 - registers its rows on import
import _catalogue_w3_tokenize  # noqa: F401 - registers its rows on import
import _catalogue_w3_writes  # noqa: F401 - registers its rows on import
import _catalogue_w4_bounded  # noqa: F401 - registers its rows on import
import _catalogue_w4_cachefs  # noqa: F401 - registers its rows on import
import _catalogue_w4_chat  # noqa: F401 - registers its rows on import
import _catalogue_w4_chatreview  # noqa: F401 - registers its rows on import
import _catalogue_w4_currblock  # noqa: F401 - registers its rows on import
import _catalogue_w4_outage  # noqa: F401 - registers its rows on import
import _catalogue_w4_rev_outage  # noqa: F401 - registers its rows on import
import _catalogue_w4_rev_verify  # noqa: F401 - registers its rows on import
import _catalogue_w4_revbounded  # noqa: F401 - registers its rows on import
import _catalogue_w4_revcachefs  # noqa: F401 - registers its rows on import
import _catalogue_w4_revcurr  # noqa: F401 - registers its rows on import
import _catalogue_w4_sftcli  # noqa: F401 - registers its rows on import
import _catalogue_w4_trainer  # noqa: F401 - registers its rows on import
import _catalogue_w4_verify  # noqa: F401 - registers its rows on import
import _catalogue_why  # noqa: F401 - registers its rows on import
from _catalogue_base import (
    BASE,
    CASES,
    ERROR_LINE,
    TIMEOUT_S,
    Case,
    Outcome,
    Run,
    _can_mount,
    build_valid,
    data_errors,
)
from click.testing import CliRunner

from tokenloom.formats import DataError
from tokenloom.formats.cli.group import main as tokenloom_main

# -- running ---------------------------------------------------------------------------------------------


def _digest(paths: list[Path]) -> dict[str, str]:
    found: dict[str, str] = {}
    for root in paths:
        if not root.exists() and not root.is_symlink():
            continue
        files = [root] if not root.is_dir() else sorted(p for p in root.rglob("*"))
        for path in files:
            if path.is_symlink():
                found[str(path)] = "-> " + os.readlink(path)
            elif path.is_file():
                try:
                    found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
                except PermissionError:
                    mode = path.stat().st_mode
                    path.chmod(0o600)
                    found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
                    path.chmod(mode)
            elif path.is_dir():
                found[str(path)] = "dir"
    return found


class Timeout(Exception):
    pass


def _alarm(_signum: int, _frame: Any) -> None:
    raise Timeout(f"no result within {TIMEOUT_S} s")


def execute(run: Run) -> Outcome:
    if run.argv is not None:
        result = CliRunner().invoke(tokenloom_main, run.argv, catch_exceptions=True, env=run.env)
        exception = result.exception if not isinstance(result.exception, SystemExit) else None
        stderr = result.stderr if result.stderr_bytes is not None else ""
        if exception is not None:
            stderr += "".join(traceback.format_exception(exception))
        return Outcome(result.exit_code, result.stdout, stderr, exception)
    if run.process is not None:
        env = {**os.environ, **(run.env or {})}
        done = subprocess.run(run.process, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
        return Outcome(done.returncode, done.stdout, done.stderr)
    if run.call is None:
        raise RuntimeError("a case's setup returned no command")
    try:
        return Outcome(0, value=run.call())
    except Timeout:
        raise
    except BaseException as exc:
        return Outcome(1, stderr="".join(traceback.format_exception(exc)), exception=exc)


def judge(item: Case, run: Run, outcome: Outcome) -> str | None:
    """None when the outcome is what the case expects, else the problem in a few words."""
    text = outcome.stdout + "\n" + outcome.stderr
    if run.call is not None:
        if item.expect == "index":
            return (
                None if isinstance(outcome.exception, IndexError) else f"expected IndexError, got {outcome.exception!r}"
            )
        if item.expect == "ok":
            if outcome.exception is not None:
                return f"raised {type(outcome.exception).__name__}: {outcome.exception}"
            return run.check(outcome) if run.check else None
        if outcome.exception is None:
            return "no error raised"
        if not isinstance(outcome.exception, DataError):
            return f"escaped {type(outcome.exception).__name__}: {str(outcome.exception)[:160]}"
        name = type(outcome.exception).__name__
        if item.error and name not in item.error:
            return f"{name} (expected {'/'.join(item.error)}): {str(outcome.exception)[:120]}"
        return run.check(outcome) if run.check else None
    if "Traceback (most recent call last)" in text:
        last = [line for line in text.strip().splitlines() if line.strip()][-1]
        return f"traceback: {last[:160]}"
    if item.expect == "ok":
        if outcome.exit_code != 0:
            return f"exit {outcome.exit_code}: {text.strip().splitlines()[-1][:160] if text.strip() else ''}"
        return run.check(outcome) if run.check else None
    if item.expect == "extra":
        lines = [line for line in outcome.stderr.strip().splitlines() if line and not line.startswith("tokenloom: ")]
        if outcome.exit_code != 2 or len(lines) != 1 or "pip install" not in lines[0]:
            return f"exit {outcome.exit_code}, {len(lines)} lines: {lines[-1][:120] if lines else ''}"
        return None
    if item.expect == "report":  # a validator: exit 1 (blocking) with its findings, or one error line
        if outcome.exit_code != 1:
            return f"exit {outcome.exit_code}, expected 1 (blocking)"
        return None if text.strip() else "exit 1 without a word"
    if outcome.exit_code not in (1, 2):
        return f"exit {outcome.exit_code}, expected 1 or 2: {text.strip()[-160:]}"
    lines = [line for line in text.splitlines() if not line.startswith("tokenloom: ")]
    named = [m.group(1) for line in lines if (m := ERROR_LINE.match(line))]
    named = [n for n in named if n in data_errors()]
    if len(named) != 1:
        if outcome.exit_code == 2 and any(line.startswith("Error: ") for line in lines) and not item.error:
            return None  # a usage error of click's (bad option value), exit 2
        return f"{len(named)} lines name a DataError: {text.strip()[-200:]}"
    if item.error and named[0] not in item.error:
        return f"{named[0]} (expected {'/'.join(item.error)})"
    return run.check(outcome) if run.check else None


def register_all() -> None:
    _catalogue_inputs.register_dataset_cross_product()
    _catalogue_inputs.register_text_cross_product()
    _catalogue_os.register_os_cases()
    _catalogue_other.register_other_commands()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default=None, help="only cases whose name or group contains this")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    logging.getLogger("tokenloom").setLevel(logging.WARNING)
    # rows reach dead endpoints on purpose: 15 s each (as the 8 retries before the budget was in time), not 600
    os.environ.setdefault("TOKENLOOM_RETRY_BUDGET", "15")
    build_valid()
    base.MOUNT_OK = _can_mount()
    register_all()
    signal.signal(signal.SIGALRM, _alarm)
    rows = []
    started = time.perf_counter()
    selected = [c for c in CASES if args.k is None or args.k in c.name or args.k in c.group]
    for number, item in enumerate(selected):
        tmp = BASE / f"case{number:04d}"
        tmp.mkdir()
        run: Run | None = None
        signal.alarm(TIMEOUT_S)
        try:
            run = item.setup(tmp)
            before = _digest(run.sources)
            outcome = execute(run)
            problem = judge(item, run, outcome)
            after = _digest(run.sources)
            if before != after:
                changed = sorted(set(before) ^ set(after) | {k for k in before if before.get(k) != after.get(k)})
                problem = f"SOURCE CHANGED {changed[:3]}" + (f"; {problem}" if problem else "")
            summary = _summary(outcome)
        except Timeout as exc:
            problem, summary = f"HANG: {exc}", "timeout"
        except Exception as exc:
            problem, summary = f"setup failed: {type(exc).__name__}: {exc}", "setup"
        finally:
            signal.alarm(0)
            if run is not None and run.cleanup is not None:
                run.cleanup()
        rows.append(
            {
                "name": item.name,
                "group": item.group,
                "expect": item.expect,
                "outcome": summary,
                "ok": problem is None,
                "problem": problem,
            }
        )
        mark = "ok  " if problem is None else "FAIL"
        print(f"{mark} {item.group:<20} {item.name:<62} {summary:<24} {problem or ''}", flush=True)
        subprocess.run(["chmod", "-R", "u+rwx", str(tmp)], capture_output=True)
    failed = [r for r in rows if not r["ok"]]
    groups: dict[str, list[int]] = {}
    for row in rows:
        groups.setdefault(row["group"], [0, 0])[0 if row["ok"] else 1] += 1
    print(
        f"\n{len(rows)} cases, {len(rows) - len(failed)} passed, {len(failed)} failed "
        f"({time.perf_counter() - started:.0f} s; OS failures {'on real mounts' if base.MOUNT_OK else 'simulated'})"
    )
    for group, (good, bad_count) in groups.items():
        print(f"  {group:<22} {good + bad_count:>4} cases  {bad_count:>3} failed")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    shutil.rmtree(BASE, ignore_errors=True)
    return 1 if failed else 0


def _summary(outcome: Outcome) -> str:
    if outcome.exception is not None:
        return type(outcome.exception).__name__
    text = outcome.stdout + "\n" + outcome.stderr
    for line in text.splitlines():
        if (m := ERROR_LINE.match(line)) and m.group(1) in data_errors():
            return f"exit {outcome.exit_code} {m.group(1)}"
    return f"exit {outcome.exit_code}"


if __name__ == "__main__":
    sys.exit(main())
