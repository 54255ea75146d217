"""Start-up check: a ``tokenloom`` command that does not train imports no torch.

Each command runs in its own interpreter through a small runner that calls the ``tokenloom``
entry point (``tokenloom.formats.cli.group:main``) and then records which heavy modules are in
``sys.modules``. Checked: ``tokenloom --help``, ``--help`` of every installed subcommand and of
every subcommand of a command group (``curriculum plan|report|status``), ``curriculum status``,
``validate`` and ``inspect`` of a dataset, ``stream-state`` and ``eval-cache`` on an existing cache,
``validate --curriculum`` and ``curriculum plan`` of a small curriculum (fixed windows and packing).

    uv run python tools/checks/startup_check.py        # exits 1 and lists every command that imports torch

The fixtures (a small native dataset, a run status, an eval cache, a one-bucket curriculum) are built
in a temporary directory; building the eval cache is training-side work and may import torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HEAVY = ("torch",)  # what a command that does not train must not import

#: Commands known to import torch still, with the reason; reported, not failed. Delete an entry once
#: its command is clean (tools/checks/test_startup_check.py's strict xfail says when).
PENDING: dict[str, str] = {}

#: The runner: argv after ``-c`` is the tokenloom command line; the report goes to $TOKENLOOM_STARTUP_REPORT.
RUNNER = r"""
import json, os, sys
from tokenloom.formats.cli import main
code = 0
try:
    main(sys.argv[1:], prog_name="tokenloom")
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
heavy = [name for name in json.loads(os.environ["TOKENLOOM_STARTUP_HEAVY"]) if name in sys.modules]
with open(os.environ["TOKENLOOM_STARTUP_REPORT"], "w") as report:
    json.dump({"exit_code": code, "heavy": heavy}, report)
"""

#: Lists (command, subcommand) pairs of command groups, e.g. ("curriculum", "status"); imports the commands.
LISTER = r"""
import json
from importlib import metadata
import click
found = []
for ep in sorted(metadata.entry_points(group="tokenloom.commands"), key=lambda ep: ep.name):
    command = ep.load()
    found.append([ep.name])
    if isinstance(command, click.Group):
        found.extend([ep.name, sub] for sub in sorted(command.commands))
print(json.dumps(found))
"""


@dataclass(frozen=True, slots=True)
class Outcome:
    args: tuple[str, ...]
    exit_code: int
    heavy: tuple[str, ...]

    def __str__(self) -> str:
        return f"tokenloom {' '.join(self.args)} (exit {self.exit_code}) imported {', '.join(self.heavy)}"


def run_command(args: list[str], *, python: str = sys.executable, cwd: Path | None = None) -> Outcome:
    """Run ``tokenloom ARGS`` in a fresh interpreter; which of HEAVY it imported, and its exit code."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        env = {
            **os.environ,
            "TOKENLOOM_STARTUP_REPORT": str(report),
            "TOKENLOOM_STARTUP_HEAVY": json.dumps(HEAVY),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
        }
        done = subprocess.run(
            [python, "-c", RUNNER, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
        )
        if not report.exists():
            raise RuntimeError(f"tokenloom {' '.join(args)} did not finish (exit {done.returncode}):\n{done.stderr}")
        result = json.loads(report.read_text())
    return Outcome(tuple(args), result["exit_code"], tuple(result["heavy"]))


def help_commands(python: str = sys.executable) -> list[list[str]]:
    """``--help`` and ``<sub> [<subsub>] --help`` of every installed command."""
    listed = subprocess.run([python, "-c", LISTER], capture_output=True, text=True, timeout=300, check=True)
    return [["--help"], *([*names, "--help"] for names in json.loads(listed.stdout))]


def build_fixtures(root: Path, python: str = sys.executable) -> dict[str, Path]:
    """A small native dataset, a run directory with its status, an empty stream-state directory, an
    eval cache built from the dataset (the build may import torch; the later check of it must not) and a
    curriculum of one bucket (``train/a`` and ``val/a``) with a config for fixed windows and one for packing."""
    program = f"""
import numpy as np
from pathlib import Path
from tokenloom.curriculum import write_run_status
from tokenloom.formats import open_writer
root = Path({str(root)!r})
with open_writer(root / "data", dtype=np.uint16, vocab_size=100, eos_id=0) as writer:
    for n in range(20):
        writer.add(np.arange(1, 30 + n, dtype=np.uint16) % 99 + 1)
write_run_status(root / "run", "running")
(root / "streams").mkdir()
for split in ("train", "val"):
    with open_writer(root / "curriculum" / split / "a", dtype=np.uint16, vocab_size=100, eos_id=0) as writer:
        for n in range(20):
            writer.add(np.arange(1, 30 + n, dtype=np.uint16) % 99 + 1)
for name, packing in (("curriculum.yaml", "false"), ("curriculum-packed.yaml", "true")):
    (root / name).write_text(
        "data:\\n  path: " + repr(str(root / "curriculum")) + "\\n  seq_len: 16\\n  packing: " + packing
        + "\\n  curriculum:\\n    - duration_tokens: 64\\n      mix:\\n        a: 1.0\\n"
    )
"""
    subprocess.run([python, "-c", program], check=True, timeout=300)
    paths = {
        "data": root / "data",
        "run": root / "run",
        "streams": root / "streams",
        "cache": root / "eval-cache",
        "curriculum": root / "curriculum.yaml",
        "curriculum-packed": root / "curriculum-packed.yaml",
        "plan-cache": root / "plan-cache",
    }
    built = run_command(eval_cache_args(paths), python=python)
    if built.exit_code != 0:
        raise RuntimeError(f"building the eval cache failed: {built}")
    return paths


def eval_cache_args(paths: dict[str, Path]) -> list[str]:
    return ["eval-cache", "--path", str(paths["data"]), "--seq-len", "16", "--cache-dir", str(paths["cache"])]


def work_commands(paths: dict[str, Path]) -> list[list[str]]:
    """Commands that read or check without training: each must exit 0 (stream-state on no files: 1)."""
    return [
        ["curriculum", "status", str(paths["run"])],
        ["validate", str(paths["data"])],
        ["inspect", str(paths["data"])],
        ["stream-state", str(paths["streams"])],
        eval_cache_args(paths),
        ["validate", "--curriculum", str(paths["curriculum"])],
        curriculum_plan_args(paths),
    ]


def curriculum_plan_args(paths: dict[str, Path]) -> list[str]:
    """``curriculum plan`` of the packing config (its packing plan cached in the fixtures, not in ~/.cache)."""
    return ["curriculum", "plan", str(paths["curriculum-packed"]), "--plan-cache-dir", str(paths["plan-cache"])]


def check(python: str = sys.executable) -> list[Outcome]:
    """Every checked command that imported something in HEAVY (the PENDING ones included)."""
    with tempfile.TemporaryDirectory() as scratch:
        paths = build_fixtures(Path(scratch), python)
        outcomes = [run_command(args, python=python) for args in [*help_commands(python), *work_commands(paths)]]
    return [o for o in outcomes if o.heavy]


def main() -> int:
    offenders = []
    for outcome in check():
        if outcome.args[0] in PENDING:
            print(f"pending: {outcome}: {PENDING[outcome.args[0]]}")
        else:
            offenders.append(outcome)
            print(outcome)
    if offenders:
        print(f"startup check: {len(offenders)} command(s) import {', '.join(HEAVY)} without training")
        return 1
    print("startup check: no command that does not train imports " + ", ".join(HEAVY))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
