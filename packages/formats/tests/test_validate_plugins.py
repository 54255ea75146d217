"""`tokenloom validate --curriculum` dispatches to the validator another package registers."""

from pathlib import Path

from click.testing import CliRunner

from tokenloom.formats.cli import commands as _commands


def test_without_a_registered_validator_the_message_names_the_package(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(_commands, "entry_points", lambda group: [])
    result = CliRunner().invoke(_commands.validate, ["--curriculum", str(tmp_path / "c.yaml")])
    assert result.exit_code == 1 and "pip install tokenloom-curriculum" in result.output


def test_a_registered_validator_gets_the_path_and_budget_options(monkeypatch, tmp_path: Path) -> None:
    calls = []

    class EntryPoint:
        name = "curriculum"

        def load(self):
            def check(path, *, global_batch_size, max_steps):
                calls.append((path, global_batch_size, max_steps))
                return 2

            return check

    monkeypatch.setattr(
        _commands, "entry_points", lambda group: [EntryPoint()] if group == "tokenloom.validators" else []
    )
    args = ["--curriculum", str(tmp_path / "c.yaml"), "--global-batch-size", "8", "--max-steps", "3"]
    result = CliRunner().invoke(_commands.validate, args)
    assert result.exit_code == 2
    assert calls == [(tmp_path / "c.yaml", 8, 3)]
