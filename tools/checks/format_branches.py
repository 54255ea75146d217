"""Format knowledge lives in its folder: no branch on a format's name outside the formats' folders.

The format folders are the directories of ``packages/formats/src/tokenloom/formats`` whose
``__init__.py`` builds a ``FormatSpec`` (or ``StoreSpec``); the names are those specs' first
arguments. Anywhere else in ``packages/*/src`` and ``src``, a comparison (``==``, ``!=``, ``in``,
``not in``), a dict key or a ``case`` pattern with one of those names as a string literal is a
violation: ask the spec (``available_formats()[name]``: ``output_name``, ``owns_file``,
``unit_shards``, ``dtypes``...) instead. Passing a name (``format="native"``) or a default is fine.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

FORMATS_SRC = Path("packages/formats/src/tokenloom/formats")
SPEC_CALLS = ("FormatSpec", "StoreSpec")
#: Files allowed a literal branch on a format name, with the reason (none today).
ALLOWED: dict[str, str] = {}


def format_folders(repo: Path) -> dict[Path, set[str]]:
    """Each format folder (relative to ``repo``) with the names its specs register."""
    folders: dict[Path, set[str]] = {}
    for init in sorted((repo / FORMATS_SRC).glob("*/__init__.py")):
        names = set()
        for node in ast.walk(ast.parse(init.read_text(), filename=str(init))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in SPEC_CALLS and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    names.add(first.value)
        if names:
            folders[init.parent.relative_to(repo)] = names
    return folders


def _literals(node: ast.AST | None) -> Iterator[ast.Constant]:
    """String constants of ``node``, or of the tuple, list or set it is."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, ast.Tuple | ast.List | ast.Set):
        for element in node.elts:
            yield from _literals(element)


def _branch_literals(tree: ast.AST) -> Iterator[ast.Constant]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                yield from _literals(operand)
        elif isinstance(node, ast.Dict):
            for key in node.keys:
                yield from _literals(key)
        elif isinstance(node, ast.MatchValue):
            yield from _literals(node.value)


def check_format_branches(repo: Path) -> list[tuple[Path, int, str]]:
    """(path, line, message) for every format-name literal branch outside the format folders."""
    folders = format_folders(repo)
    names = set().union(*folders.values()) if folders else set()
    sources = [*sorted(repo.glob("packages/*/src/**/*.py")), *sorted(repo.glob("src/**/*.py"))]
    found = []
    for path in sources:
        relative = path.relative_to(repo)
        if relative.as_posix() in ALLOWED or any(relative.is_relative_to(folder) for folder in folders):
            continue
        for literal in _branch_literals(ast.parse(path.read_text(), filename=str(path))):
            if literal.value in names:
                found.append(
                    (
                        relative,
                        literal.lineno,
                        f"a branch on the format name {literal.value!r} outside the formats' folders: "
                        "ask its FormatSpec (tokenloom.formats.available_formats()) instead",
                    )
                )
    return found
