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


def _decorator_help(function: ast.FunctionDef) -> str | None:
    """``help=`` / ``short_help=`` of the ``@click.command(...)`` / ``@x.group(...)`` decorator (not of options)."""
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else None
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
        if isinstance(decorator, ast.Call) and name in ("command", "group"):
            for keyword in decorator.keywords:
                value = keyword.value
                if keyword.arg in ("help", "short_help") and isinstance(value, ast.Constant):
                    return value.value if isinstance(value.value, str) else None
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
            text = _decorator_help(node) or ast.get_docstring(node)
            if not text:
                return None
            return make_default_short_help(inspect.cleandoc(text), limit)
    return None
