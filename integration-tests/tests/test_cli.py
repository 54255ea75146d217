"""The one `tokenloom` command, as installed with every package."""

import subprocess
import sys


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tokenloom.formats", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_version_lists_every_installed_package() -> None:
    result = run("--version")
    assert result.returncode == 0, result.stderr
    names = [line.split()[0] for line in result.stdout.splitlines()]
    assert "tokenloom" in names
    assert "tokenloom-formats" in names


def test_help_lists_installed_commands() -> None:
    result = run("--help")
    assert result.returncode == 0, result.stderr
    assert "Commands:" in result.stdout or "Usage:" in result.stdout
