"""Format knowledge lives in its folder: no branch on a format's name outside the formats' folders.

The format folders are the directories of ``packages/formats/src/tokenloom/formats`` whose
``__init__.py`` builds a ``FormatSpec`` (or ``StoreSpec``); the names are those specs' first
arguments. Anywhere else in ``packages/*/src`` and ``src``, a comparison (``==``, ``!=``, ``in``,
``not in``), a dict key, a ``case`` pattern, either value of a conditional expression (``"h5" if x else
"bin-meta"``) or a ``click.Choice`` list with one of those names as a string literal is a violation, and so is
a comparison with a module constant (of the same module, or imported from a tokenloom module) that holds a
literal tuple, list or set of them (``name in _NAMES``): ask the spec (``available_formats()[name]``:
``output_name``, ``owns_file``, ``unit_shards``, ``dtypes``...) instead. Passing a name (``format="native"``)
or a default is fine.
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


def _constants(tree: ast.Module) -> dict[str, ast.expr]:
    """Module-level ``NAME = <expr>`` assignments."""
    found: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    found[target.id] = node.value
    return found


def _module_file(repo: Path, dotted: str) -> Path | None:
    """The source file of a tokenloom module (``tokenloom.formats.keyed`` -> its ``__init__.py``), or None."""
    parts = dotted.split(".")
    if parts[0] != "tokenloom" or len(parts) < 2:
        return None
    roots = [*repo.glob(f"packages/*/src/tokenloom/{parts[1]}"), *repo.glob(f"src/tokenloom/{parts[1]}")]
    for root in roots:
        base = root.joinpath(*parts[2:])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _named_constants(repo: Path, tree: ast.Module, folders: list[Path]) -> dict[str, ast.expr]:
    """Constants a module can name: its own, and those it imports by name from a tokenloom module outside the
    format folders (a folder's own constants are that format's knowledge, asked of it)."""
    found: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            source = _module_file(repo, node.module)
            if source is None or any(source.relative_to(repo).is_relative_to(folder) for folder in folders):
                continue
            theirs = _constants(ast.parse(source.read_text(), filename=str(source)))
            found.update({a.asname or a.name: theirs[a.name] for a in node.names if a.name in theirs})
    return {**found, **_constants(tree)}


def _is_choice(node: ast.Call) -> bool:
    func = node.func
    return (func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)) == "Choice"


def _branch_literals(tree: ast.Module, repo: Path, folders: list[Path]) -> Iterator[ast.Constant]:
    constants = _named_constants(repo, tree, folders)
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                yield from _literals(operand)
                if isinstance(operand, ast.Name) and operand.id in constants:
                    for literal in _literals(constants[operand.id]):  # reported where the branch stands
                        yield ast.Constant(literal.value, lineno=node.lineno, col_offset=node.col_offset)
        elif isinstance(node, ast.Dict):
            for key in node.keys:
                yield from _literals(key)
        elif isinstance(node, ast.MatchValue):
            yield from _literals(node.value)
        elif isinstance(node, ast.IfExp):
            yield from _literals(node.body)
            yield from _literals(node.orelse)
        elif isinstance(node, ast.Call) and _is_choice(node):
            for argument in node.args:
                yield from _literals(argument)
                if isinstance(argument, ast.Name) and argument.id in constants:
                    for literal in _literals(constants[argument.id]):
                        yield ast.Constant(literal.value, lineno=node.lineno, col_offset=node.col_offset)


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
        seen: set[tuple[int, str]] = set()  # a literal and a constant naming it on one line: one finding
        for literal in _branch_literals(ast.parse(path.read_text(), filename=str(path)), repo, list(folders)):
            if literal.value in names and (literal.lineno, literal.value) not in seen:
                seen.add((literal.lineno, literal.value))
                found.append(
                    (
                        relative,
                        literal.lineno,
                        f"a branch on the format name {literal.value!r} outside the formats' folders: "
                        "ask its FormatSpec (tokenloom.formats.available_formats()) instead",
                    )
                )
    return found
