"""A command that does not train imports no torch: every ``--help``, ``curriculum status``, ``validate``,
``inspect``, ``stream-state``, ``eval-cache`` on an existing cache, ``validate --curriculum`` and
``curriculum plan`` (with ``--plot`` too: matplotlib, not torch), each in a fresh interpreter."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import startup_check


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return startup_check.build_fixtures(tmp_path_factory.mktemp("startup"))


def test_the_runner_sees_a_command_that_imports_torch(tmp_path: Path) -> None:
    """`curriculum report` builds a dataset, so it imports torch (before it finds the config missing)."""
    outcome = startup_check.run_command(
        ["curriculum", "report", str(tmp_path / "missing.yaml"), "--step", "1", "--global-batch-size", "1"]
    )
    assert outcome.heavy == ("torch",)
    assert outcome.exit_code == 1


def test_help_lists_every_group_subcommand() -> None:
    commands = startup_check.help_commands()
    assert ["--help"] in commands
    assert ["curriculum", "status", "--help"] in commands
    assert ["validate", "--help"] in commands


def test_no_help_imports_torch() -> None:
    commands = [c for c in startup_check.help_commands() if c[0] not in startup_check.PENDING]
    offenders = [o for o in map(startup_check.run_command, commands) if o.heavy]
    assert [str(o) for o in offenders] == []


@pytest.mark.parametrize("command", ["curriculum status", "validate", "inspect"])
def test_reading_commands_import_no_torch(fixtures: dict[str, Path], command: str) -> None:
    args = next(a for a in startup_check.work_commands(fixtures) if " ".join(a).startswith(command))
    outcome = startup_check.run_command(args)
    assert outcome.exit_code == 0
    assert outcome.heavy == ()


def test_eval_cache_check_of_an_existing_cache_imports_no_torch(fixtures: dict[str, Path]) -> None:
    outcome = startup_check.run_command(startup_check.eval_cache_args(fixtures))
    assert outcome.exit_code == 0
    assert outcome.heavy == ()


def test_validate_curriculum_imports_no_torch(fixtures: dict[str, Path]) -> None:
    """The plan (bucket sizes, schedule, drains) is numpy: validating a curriculum needs no torch."""
    outcome = startup_check.run_command(["validate", "--curriculum", str(fixtures["curriculum"])])
    assert outcome.exit_code == 0
    assert outcome.heavy == ()


def test_curriculum_plan_imports_no_torch(fixtures: dict[str, Path]) -> None:
    """With packing: the packing plan is computed and cached without torch too."""
    outcome = startup_check.run_command(startup_check.curriculum_plan_args(fixtures))
    assert outcome.exit_code == 0
    assert outcome.heavy == ()


def test_curriculum_plan_with_a_plot_imports_no_torch(fixtures: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    picture = tmp_path / "plan.png"
    outcome = startup_check.run_command([*startup_check.curriculum_plan_args(fixtures), "--plot", str(picture)])
    assert outcome.exit_code == 0
    assert outcome.heavy == ()
    assert picture.stat().st_size > 0


@pytest.mark.parametrize("arg", ["--help", "streams"])
def test_stream_state_imports_no_torch(fixtures: dict[str, Path], arg: str) -> None:
    """stream-state reads JSON state files: no torch (hf-streaming exports its dataset lazily)."""
    outcome = startup_check.run_command(["stream-state", str(fixtures[arg]) if arg in fixtures else arg])
    assert outcome.heavy == ()
