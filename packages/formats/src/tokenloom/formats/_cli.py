"""The ``tokenloom`` command: a click group whose subcommands are entry points.

A package adds commands by declaring, in its pyproject::

    [project.entry-points."tokenloom.commands"]
    validate = "tokenloom.formats._commands:validate"

The value is a click command (a typer app converts with typer.main.get_command). Commands load lazily, so
``tokenloom --help`` stays fast and a broken or missing package only affects its
own commands.
"""

from __future__ import annotations

from importlib import metadata

import click

ENTRY_POINT_GROUP = "tokenloom.commands"


def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _as_click(obj: object, name: str) -> click.Command:
    if isinstance(obj, click.Command):
        return obj
    raise click.ClickException(
        f"entry point {name!r} in group {ENTRY_POINT_GROUP!r} is a {type(obj).__name__}, "
        "expected a click command; reinstall the package that provides it"
    )


def installed_versions() -> list[tuple[str, str]]:
    """(distribution, version) for every installed tokenloom distribution, sorted."""
    found = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"] or ""
        if name == "tokenloom" or name.startswith("tokenloom-"):
            found[name] = dist.version
    return sorted(found.items())


class EntryPointGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_entry_points())

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        ep = _entry_points().get(cmd_name)
        if ep is None:
            return None
        return _as_click(ep.load(), cmd_name)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    for name, version in installed_versions():
        click.echo(f"{name} {version}")
    ctx.exit()


@click.group(
    cls=EntryPointGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Example:  tokenloom validate data/tokens --deep",
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Print every installed tokenloom package and its version.",
)
def main() -> None:
    """tokenloom: raw text to training batches on every rank.

    The commands below come from the tokenloom packages installed here;
    installing another package (e.g. tokenloom-tokenize) adds its commands.
    """
