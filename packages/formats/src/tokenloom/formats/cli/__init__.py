"""The ``tokenloom`` command group and the validate, inspect and convert commands.

``group.py`` holds the click group (subcommands from the ``tokenloom.commands`` entry points,
loaded lazily), ``cli_errors``, which sibling packages' commands use to turn a DataError into
one line, and ``option`` / ``choice``, the option shape every command shares; ``lazy_help.py``
reads a command's one-line help without importing it; ``commands.py`` holds validate, inspect and
convert, ``deep.py`` validate --deep's read, ``summary.py`` what they print. No reader imports this package.
"""

from tokenloom.formats.cli.group import choice, cli_errors, main, option

__all__ = ["choice", "cli_errors", "main", "option"]
