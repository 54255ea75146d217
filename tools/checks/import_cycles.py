"""No import cycle inside a package: every import statement counts.

Each module of a package (``packages/*/src/tokenloom/<pkg>``, the root ``src/tokenloom/<pkg>``) is a node;
an edge is any import of a module of the same package, wherever it stands: at module level, inside a
function (which hides a cycle from the interpreter, it does not remove it) or under
``if TYPE_CHECKING:`` (a cycle of annotations is still two modules that cannot be read apart). An
``importlib.import_module(...)`` whose argument is a literal (a string, a module constant, an f-string over
the items of a literal loop) is an edge too, and so is every module a lazy-export table names (the mapping
given to ``lazy_exports``: its string values, ``dict.fromkeys(names, MODULE)``, comprehensions over literal
tuples): importing on first use defers the import, it does not remove it. The
implicit import of a parent package (``from pkg.sub.mod import x`` runs ``pkg/sub/__init__.py``) is not
an edge. A strongly connected component of more than one module is a violation, unless it is one of
:data:`ALLOWED_CYCLES` exactly: a component that grows, or a new one, fails.

Run on its own: ``python tools/checks/import_cycles.py [ROOT]`` lists every component; ``repo_checks.py``
runs it with the others.
"""

from __future__ import annotations

import ast
import itertools
import sys
from dataclasses import dataclass
from pathlib import Path

#: Components accepted as they are (none: no package has an import cycle). Exactly these pass.
ALLOWED_CYCLES: frozenset[frozenset[str]] = frozenset()


@dataclass(frozen=True, slots=True)
class Cycle:
    """One strongly connected component of a package's import graph."""

    package: str  # "tokenloom.formats"
    members: frozenset[str]  # dotted module names
    path: list[str]  # one closed walk through it: path[0] == path[-1]
    lines: list[int]  # lines[i]: the line in path[i] that imports path[i + 1]
    file: Path  # the file of path[0]

    def describe(self) -> str:
        short = [m.removeprefix(self.package + ".") for m in self.path]
        steps = " -> ".join(f"{a} (line {line})" for a, line in zip(short, self.lines, strict=False))
        names = ", ".join(sorted(m.removeprefix(self.package + ".") for m in self.members))
        return f"import cycle in {self.package}: {steps} -> {short[-1]} (all of {{{names}}})"


def package_modules(package_dir: Path, dotted: str) -> dict[str, Path]:
    """Module name -> file for a package directory (``__init__.py`` is the package's own name)."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join([dotted, *parts])] = path
    return modules


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: dict[str, Path]) -> list[str]:
    """The dotted names an import statement in ``module`` brings in (``from pkg import sub`` names ``pkg.sub``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        anchor = module.split(".")
        anchor = anchor if is_package else anchor[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, *([base] if base else [])])
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]


def _constants(tree: ast.Module) -> dict[str, ast.expr]:
    """Module-level ``NAME = <expr>`` assignments (the last one wins)."""
    found: dict[str, ast.expr] = {}
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for target in targets:
            if isinstance(target, ast.Name) and getattr(node, "value", None) is not None:
                found[target.id] = node.value  # pyright: ignore[reportAttributeAccessIssue]
    return found


def strings(node: ast.AST | None, env: dict[str, list[str]], constants: dict[str, ast.expr]) -> list[str]:
    """The strings ``node`` statically stands for: a literal, a module constant, a tuple/list/set of them, an
    f-string over names bound to literals, a dict's values (and ``**`` parts), ``dict.fromkeys(keys, VALUE)``,
    a comprehension over literals; [] where it depends on run time."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name):
        if node.id in env:
            return env[node.id]
        value = constants.get(node.id)
        return strings(value, env, {k: v for k, v in constants.items() if k != node.id}) if value else []
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [s for element in node.elts for s in strings(element, env, constants)]
    if isinstance(node, ast.JoinedStr):
        results = [""]
        for part in node.values:
            pieces = strings(part.value if isinstance(part, ast.FormattedValue) else part, env, constants)
            if not pieces:
                return []
            results = [r + p for r in results for p in pieces]
        return results
    if isinstance(node, ast.Dict):
        return [s for value in node.values for s in strings(value, env, constants)]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "fromkeys":
        return strings(node.args[1], env, constants) if len(node.args) == 2 else []
    if isinstance(node, ast.DictComp | ast.ListComp | ast.SetComp | ast.GeneratorExp) and len(node.generators) == 1:
        loop = node.generators[0]
        items = strings(loop.iter, env, constants)
        if not isinstance(loop.target, ast.Name) or not items:
            return []
        element = node.value if isinstance(node, ast.DictComp) else node.elt
        return [s for item in items for s in strings(element, {**env, loop.target.id: [item]}, constants)]
    return []


def _call_name(node: ast.Call) -> str | None:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def dynamic_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module name) of every ``import_module(<literal>)`` and every module a lazy-export table names."""
    constants = _constants(tree)
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, env: dict[str, list[str]]) -> None:
        if isinstance(node, ast.For | ast.comprehension) and isinstance(node.target, ast.Name):
            items = strings(node.iter, env, constants)
            if items:
                env = {**env, node.target.id: items}
        if isinstance(node, ast.Call) and node.args:
            name = _call_name(node)
            if name == "import_module":
                found.extend((node.lineno, target) for target in strings(node.args[0], env, constants))
            elif name == "lazy_exports" and len(node.args) > 1:
                found.extend((node.lineno, target) for target in strings(node.args[1], env, constants))
        for child in ast.iter_child_nodes(node):
            visit(child, env)

    visit(tree, {})
    return found


def import_graph(package_dir: Path, dotted: str) -> dict[str, dict[str, int]]:
    """module -> {module of the same package it imports: line of the first such import}."""
    modules = package_modules(package_dir, dotted)
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}

    def owner(target: str) -> str | None:  # the package module that `target` names (a name inside it counts)
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target or None

    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        statements = [
            (node.lineno, target)
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for target in _imported(node, name, path.name == "__init__.py", modules)
        ]
        for line, target in sorted([*statements, *dynamic_imports(tree)]):
            module = owner(target) if target == dotted or target.startswith(dotted + ".") else None
            if module is not None and module != name:
                graph[name].setdefault(module, line)
    return graph


def components(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:  # packages are small, recursion depth is fine
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(found)


def _walk(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """A closed walk inside ``component`` from its first module (every module there has an edge back in)."""
    members, start = set(component), component[0]
    path, seen = [start], {start}
    while True:
        edges = sorted(graph[path[-1]])
        nxt = (
            start
            if start in graph[path[-1]]
            else next((m for m in edges if m in members and m not in seen), None)
            or next(m for m in edges if m in members)
        )
        path.append(nxt)
        if nxt in seen:
            return path[path.index(nxt) :]
        seen.add(nxt)


def package_dirs(repo: Path) -> list[tuple[Path, str]]:
    """(directory, dotted name) of every tokenloom package under packages/*/src and the root src."""
    found = [*repo.glob("packages/*/src/tokenloom/*/__init__.py"), *repo.glob("src/tokenloom/*/__init__.py")]
    return [(p.parent, f"tokenloom.{p.parent.name}") for p in sorted(found)]


def find_cycles(repo: Path, packages: list[str] | None = None) -> list[Cycle]:
    """Every import cycle of every package (or of the packages named, e.g. ``["curriculum"]``)."""
    cycles = []
    for directory, dotted in package_dirs(repo):
        if packages is not None and dotted.split(".")[1] not in packages:
            continue
        graph = import_graph(directory, dotted)
        files = package_modules(directory, dotted)
        for component in components(graph):
            path = _walk(graph, component)
            lines = [graph[a][b] for a, b in itertools.pairwise(path)]
            cycles.append(Cycle(dotted, frozenset(component), path, lines, files[path[0]]))
    return cycles


def disallowed(cycles: list[Cycle], allowed: frozenset[frozenset[str]] = ALLOWED_CYCLES) -> list[Cycle]:
    """The cycles that are not exactly an allowed component."""
    return [cycle for cycle in cycles if cycle.members not in allowed]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    repo = Path(args[0]) if args else Path(__file__).resolve().parents[2]
    cycles = find_cycles(repo)
    for cycle in cycles:
        print(("allowed: " if cycle.members in ALLOWED_CYCLES else "") + cycle.describe())
    gone = ALLOWED_CYCLES - {cycle.members for cycle in cycles}
    for members in sorted(sorted(m) for m in gone):
        print(f"allowed but gone (remove it from ALLOWED_CYCLES): {', '.join(members)}")
    return 1 if disallowed(cycles) else 0


if __name__ == "__main__":
    raise SystemExit(main())
