"""Short help of an entry-point command read from its source, so ``tokenloom --help`` imports no command.

Loading a command module imports its package, and four packages import torch (5-10 s).
The root help needs one line per command, which is the command function's docstring (or
the ``help=`` of its click decorator): this module finds the module's file under the
``tokenloom`` namespace's directories without importing it, parses it with ``ast`` and
returns that line. Anything it cannot read returns None and the caller loads the command.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import cast

__all__ = ["short_help_from_source"]


def _module_file(module: str) -> Path | None:
    """The .py file of ``module`` ("tokenloom.curriculum._commands") without importing its package."""
    head, _, rest = module.partition(".")
    if head != "tokenloom" or not rest:
        return None
    spec = importlib.util.find_spec(head)  # the namespace package: no code runs
    if spec is None or spec.submodule_search_locations is None:
        return None
    relative = Path(*rest.split("."))
    for root in spec.submodule_search_locations:
        for candidate in (Path(root) / relative.with_suffix(".py"), Path(root) / relative / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


class _Unreadable(Exception):
    """The decorator says something this reader does not reproduce: load the command instead."""


def _decorator_help(function: ast.FunctionDef) -> tuple[str, bool] | None:
    """``short_help=`` (which click prefers), else ``help=``, of the ``@click.command(...)`` / ``@x.group(...)``
    decorator (not of options). Raises _Unreadable for what only click can render: a help that is not a string
    literal, or ``deprecated`` / ``hidden`` / ``cls`` / ``**kwargs``."""
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else None
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
        if isinstance(decorator, ast.Call) and name in ("command", "group"):
            found: dict[str, str] = {}
            for keyword in decorator.keywords:
                if keyword.arg is None or keyword.arg in ("deprecated", "hidden", "cls"):
                    raise _Unreadable(keyword.arg)
                if keyword.arg in ("help", "short_help"):
                    value = keyword.value
                    if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
                        raise _Unreadable(keyword.arg)
                    found[keyword.arg] = value.value
            if "short_help" in found:  # click shows it as written, untruncated
                return found["short_help"], True
            return (found["help"], False) if "help" in found else None
    return None


def short_help_from_source(entry_point: metadata.EntryPoint, limit: int = 45) -> str | None:
    """The command's one-line help as click would show it, or None when the source does not say."""
    from click import utils

    make_default_short_help = cast(Callable[[str, int], str], utils.make_default_short_help)  # typed as object
    module, _, attr = entry_point.value.partition(":")
    path = _module_file(module.strip())
    if path is None or not attr:
        return None
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == attr.strip():
            try:
                declared = _decorator_help(node)
            except _Unreadable:
                return None
            if declared is not None and declared[1]:
                return inspect.cleandoc(declared[0]).strip()
            text = declared[0] if declared is not None else ast.get_docstring(node)
            if not text:
                return None
            return make_default_short_help(inspect.cleandoc(text), limit)
    return None
