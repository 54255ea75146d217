from importlib import metadata

import click
import pytest
from click.testing import CliRunner

from tokenloom.formats.cli import group as _cli
from tokenloom.formats.io import require


def test_version_prints_installed_tokenloom_packages() -> None:
    result = CliRunner().invoke(_cli.main, ["--version"])
    assert result.exit_code == 0
    assert "tokenloom-formats 0.1.0" in result.output


def test_commands_come_from_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    @click.command()
    def hello() -> None:
        """Say hello."""
        click.echo("hello from a plugin")

    ep = metadata.EntryPoint("hello", "x:y", _cli.ENTRY_POINT_GROUP)
    monkeypatch.setattr(_cli, "_entry_points", lambda: {"hello": ep})
    monkeypatch.setattr(metadata.EntryPoint, "load", lambda self: hello)
    runner = CliRunner()
    help_result = runner.invoke(_cli.main, ["--help"])
    assert "hello" in help_result.output
    assert "Say hello." in help_result.output
    assert runner.invoke(_cli.main, ["hello"]).output == "hello from a plugin\n"


def test_missing_command_is_absent_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_cli, "_entry_points", lambda: {})
    result = CliRunner().invoke(_cli.main, ["tokenize"])
    assert result.exit_code == 2
    assert "No such command 'tokenize'" in result.output


def test_missing_optional_dependency_names_the_install_command() -> None:
    with pytest.raises(ImportError, match=r'pip install "tokenloom-formats\[h5\]"'):
        require("tokenloom_no_such_module", distribution="tokenloom-formats", extra="h5", purpose="HDF5")
