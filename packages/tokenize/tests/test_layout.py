"""How the tokenize package reads: an entry point named for it, one executor, no import cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import tokenloom.tokenize
from tokenloom.tokenize import _executor, pack, tokenize

PACKAGE = "tokenloom.tokenize"
SOURCE = Path(tokenloom.tokenize.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(SOURCE.rglob("*.py")):
        parts = [part for part in path.relative_to(SOURCE).with_suffix("").parts if part != "__init__"]
        found[".".join([PACKAGE, *parts])] = path
    return found


def _import_graph() -> dict[str, set[str]]:
    """Every import between the package's modules, at module level or inside functions.

    Read strictly: ``from tokenloom.tokenize import _x`` is an edge to ``_x`` and to the
    package's ``__init__`` (which runs first), so a module that reaches back through the
    package counts as a cycle.
    """
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typing_only = {  # imports under `if TYPE_CHECKING:` never run (as in tools/checks/repo_checks.py)
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If)
            and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
            for statement in node.body
            for inner in ast.walk(statement)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            graph[name] |= {target for target in targets if target in modules and target != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (as a path that returns to its start), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        path.append(node)
        for target in sorted(graph[node]):
            found = visit(target)
            if found is not None:
                return found
        path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start)
        if found is not None:
            return found
    return None


def test_the_tokenize_modules_import_each_other_without_a_cycle() -> None:
    graph = _import_graph()
    assert f"{PACKAGE}._tokenize" in graph
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_tokenize_and_pack_live_in_modules_named_for_them() -> None:
    assert tokenize.__module__ == f"{PACKAGE}._tokenize"
    assert pack.__module__ == f"{PACKAGE}._pack"


def test_every_process_pool_of_tokenize_is_made_in_one_place() -> None:
    """Encoding workers (native, staged and pack runs) and the tokenizer-describing child share spawn_pool."""
    makers = []
    for name, path in _modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in (
                "ProcessPoolExecutor",
                "Pool",
                "Process",
            ):
                makers.append(f"{name}:{node.lineno}")
    assert len(makers) == 1 and makers[0].startswith(f"{_executor.__name__}:"), makers
