"""`tokenloom --help` lists every command without importing any (no torch), with the same one-line help."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import click
import pytest

from tokenloom.formats.cli.group import ENTRY_POINT_GROUP
from tokenloom.formats.cli.lazy_help import short_help_from_source

PROBE = """
import sys
from tokenloom.formats.cli.group import main
try:
    main(sys.argv[1:], prog_name="tokenloom")
except SystemExit:
    pass
heavy = sorted(m for m in ("torch", "transformers", "datasets", "tokenloom.curriculum", "tokenloom.hf_streaming")
               if m in sys.modules)
print("HEAVY", heavy)
"""


@pytest.mark.parametrize("args", [["--help"], ["validate", "--help"], ["convert", "--help"]])
def test_help_imports_no_torch(args: list[str]) -> None:
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "HEAVY []" in done.stdout, done.stdout[-300:]
    assert "Usage: tokenloom" in done.stdout


def test_short_help_from_source_is_what_the_loaded_command_says() -> None:
    """For every installed command: the source-read line equals click's own short help of the loaded command."""
    points = list(metadata.entry_points(group=ENTRY_POINT_GROUP))
    assert {"validate", "inspect", "convert"} <= {ep.name for ep in points}
    for ep in points:
        for limit in (45, 70):
            from_source = short_help_from_source(ep, limit)
            loaded = ep.load()
            assert isinstance(loaded, click.Command)
            assert from_source == loaded.get_short_help_str(limit), ep.name


def test_root_help_lists_every_command() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE, "--help"], capture_output=True, text=True, timeout=120)
    listed = done.stdout.split("Commands:")[1]
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        assert f"  {ep.name} " in listed or f"  {ep.name}\n" in listed, ep.name


def test_what_only_click_can_render_falls_back_to_loading(tmp_path, monkeypatch) -> None:
    """short_help wins over help and is not cut; a computed help, deprecated or hidden: None (load it)."""
    import sys
    from importlib import metadata

    import tokenloom

    package = tmp_path / "tokenloom" / "lazyfixture"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    long_short = "a short help that is longer than forty-five characters, shown whole"
    (package / "cmds.py").write_text(
        "import click\nHELP = 'computed'\n"
        f"@click.command(help='the long help', short_help={long_short!r})\ndef both():\n    pass\n"
        "@click.command(help=HELP)\ndef computed():\n    '''Docstring.'''\n"
        "@click.command(deprecated=True)\ndef old():\n    '''Old one.'''\n"
        "@click.command(hidden=True)\ndef secret():\n    '''Secret.'''\n"
        "@click.command()\ndef plain():\n    '''Plain docstring. More.'''\n"
    )
    monkeypatch.setattr(tokenloom, "__path__", [*tokenloom.__path__, str(tmp_path / "tokenloom")])
    monkeypatch.syspath_prepend(str(tmp_path))

    def ep(name: str) -> metadata.EntryPoint:
        return metadata.EntryPoint(name, f"tokenloom.lazyfixture.cmds:{name}", "tokenloom.commands")

    assert short_help_from_source(ep("both")) == long_short
    assert short_help_from_source(ep("computed")) is None
    assert short_help_from_source(ep("old")) is None
    assert short_help_from_source(ep("secret")) is None
    assert short_help_from_source(ep("plain")) == "Plain docstring."
    assert "tokenloom.lazyfixture.cmds" not in sys.modules  # read, never imported
