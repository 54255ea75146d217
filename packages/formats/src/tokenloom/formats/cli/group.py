"""The ``tokenloom`` command: a click group whose subcommands are entry points.

A package adds commands by declaring, in its pyproject::

    [project.entry-points."tokenloom.commands"]
    validate = "tokenloom.formats.cli.commands:validate"

The value is a click command (a typer app converts with typer.main.get_command). Commands load lazily:
``tokenloom --help`` reads each command's one-line help from its source (``_lazy_help``) and
imports none of them, ``tokenloom validate --help`` imports only validate's module, and a
broken or missing package only affects its own commands.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from importlib import metadata
from typing import Any, NoReturn

import click

from tokenloom.formats.cli.lazy_help import short_help_from_source
from tokenloom.formats.errors import DataError
from tokenloom.formats.io.storage import storage_error

ENTRY_POINT_GROUP = "tokenloom.commands"
DEBUG_KEY = "tokenloom.debug"
#: Exit codes: 1 for bad data / a failed operation, 2 for usage and installation problems (like click's).
EXIT_DATA, EXIT_USAGE = 1, 2


def debug_enabled() -> bool:
    """Whether ``tokenloom --debug`` (or TOKENLOOM_DEBUG=1) asked for tracebacks."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.meta.get(DEBUG_KEY):
        return True
    return os.environ.get("TOKENLOOM_DEBUG", "") not in ("", "0")


def fail(exc: BaseException) -> NoReturn:
    """End a command on ``exc`` with one line on stderr (the traceback under --debug)."""
    if debug_enabled():
        raise exc
    if isinstance(exc, BrokenPipeError):  # `tokenloom validate X | head`: the reader left; nothing to report
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's final flush quiet
        raise SystemExit(EXIT_DATA) from None
    if isinstance(exc, OSError):
        exc = storage_error(exc)
    if isinstance(exc, DataError):
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc
    if isinstance(exc, ImportError):
        click.echo(f"Error: {exc}", err=True)
        raise SystemExit(EXIT_USAGE) from exc
    raise exc


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


@contextlib.contextmanager
def cli_errors() -> Iterator[None]:
    """Inside a command: DataError, OSError (as StorageError) and a missing extra end it with one line."""
    try:
        yield
    except (DataError, OSError, ImportError) as exc:
        fail(exc)


def option(*decls: str, **attrs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``click.option`` that shows its default in --help whenever it has one (a flag's is not shown)."""
    attrs.setdefault("show_default", attrs.get("default") is not None and not attrs.get("is_flag"))
    return click.option(*decls, **attrs)


def choice(values: Iterable[Any]) -> click.Choice:
    """The values of an enum (or of any iterable of StrEnum members or strings) as a click choice."""
    return click.Choice([str(value) for value in values])


class EntryPointGroup(click.Group):
    def invoke(self, ctx: click.Context):  # one line for data, OS and missing-extra errors
        with cli_errors():
            return super().invoke(ctx)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_entry_points())

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        ep = _entry_points().get(cmd_name)
        if ep is None:
            return None
        return _as_click(ep.load(), cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """One line per command, read from the command's source: listing them imports none (no torch)."""
        points = _entry_points()
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = []
        for name in names:
            text = short_help_from_source(points[name], limit)
            if text is None:  # not readable from the source: load the command as click would
                command = self.get_command(ctx, name)
                if command is None or command.hidden:
                    continue
                text = command.get_short_help_str(limit)
            rows.append((name, text))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


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
@click.option("--debug", is_flag=True, help="Show the full traceback when a command fails.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """tokenloom: raw text to training batches on every rank.

    The commands below come from the tokenloom packages installed here;
    installing another package (e.g. tokenloom-tokenize) adds its commands.
    Errors print one line (exit 1 for data and settings, 2 for command-line usage and
    missing extras); --debug shows the traceback.
    """
    ctx.meta[DEBUG_KEY] = debug
    _file_names_print_as_they_are()
    _log_to_stderr(logging.DEBUG if debug else logging.INFO)


def _file_names_print_as_they_are() -> None:
    """A file name that is not UTF-8 (Python holds its bytes as surrogates) prints as its bytes, as ls does.

    Without this, a strict UTF-8 stdout (a UTF-8 locale, PYTHONIOENCODING=utf-8) ends a command that has
    done its work with UnicodeEncodeError while it prints the path in its summary or error line.
    """
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "encoding", "").lower().replace("-", "") == "utf8":
            reconfigure(errors="surrogateescape")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is now (test runners and progress bars replace it)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def _log_to_stderr(level: int) -> None:
    """tokenloom's log lines (start-up choices, healed caches, stale locks) on stderr, one line each."""
    logger = logging.getLogger("tokenloom")
    if not any(getattr(h, "_tokenloom_cli", False) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("tokenloom: %(message)s"))
        handler._tokenloom_cli = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(level)
