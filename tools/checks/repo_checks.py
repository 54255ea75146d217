"""Repository checks that keep the workspace honest.

1. PEP 420: no package may ship ``src/tokenloom/__init__.py`` (it would hide
   every other tokenloom package).
2. Dependency direction: a package may import only the tokenloom packages it
   declares as dependencies, and never another package's private (``_name``)
   module.
3. Light imports: importing ``tokenloom.formats`` (what every DataLoader worker that reads a
   shard does) loads neither click nor rich; the CLI lives in ``tokenloom.formats.cli``.
4. One version policy: every project shares one version, and a published
   project requires its tokenloom siblings at exactly that version (``==``).
5. No import cycle inside a package: the graph of every package's imports of
   its own modules has no cycle. Every import counts, at module level, inside a
   function (a function-local import that closes a loop hides the cycle from the
   interpreter, it does not remove it) or under ``if TYPE_CHECKING:``, and so do
   ``importlib.import_module`` of a literal and the modules a lazy-export table names. Each
   package is checked on its own; ``import_cycles.ALLOWED_CYCLES`` (empty) would list
   an accepted exception (see ``import_cycles.py``).
6. One vocabulary: ``train_type``, ``format``, ``path``, ``seq_len``. The old names
   ``training_type``, ``storage_type`` and ``load_path`` appear in packages/*/src only on lines
   marked ``# old-name`` (DatasetFactory's seed-API keywords that AstrAI users port from).
7. Nothing machine-specific is tracked: no built artifacts (wheels, eggs, shared objects, sdists)
   and no absolute path of a build machine (``/work/...``, ``/root/...``, ``/home/<user>/...``,
   pytest's ``/tmp/pytest-of-...``) in a tracked text file.
8. Format knowledge lives in its folder: no branch on a format's name (``== "native"``, a dict keyed
   by ``"megatron"``, ``"h5" if x else "bin-meta"``, ``name in NAMES`` with a constant of literal names, a
   ``click.Choice`` of them...) outside the formats' folders (``format_branches.py``).
9. One walk for ``--num-nodes``: in tokenize, ``num_nodes`` / ``node_rank`` are named (as code, not prose)
   only by the command, the config, the unit files and the publisher (``NODE_ROOMS``); every other module
   reads the frozen ``config.nodes`` value, so the option's walk to a committed unit stays short.

Run: ``python tools/checks/repo_checks.py [ROOT]``; exits 1 and lists every
violation. (Start-up, that no command that does not train imports torch, needs
the installed environment and runs apart: ``tools/checks/startup_check.py``.)
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from format_branches import check_format_branches
from import_cycles import ALLOWED_CYCLES, disallowed, find_cycles


@dataclass(frozen=True, slots=True)
class Violation:
    path: Path
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


@dataclass(frozen=True, slots=True)
class Project:
    root: Path
    distribution: str
    import_name: str | None  # "formats" for tokenloom.formats; None for non-packaged projects
    declared: frozenset[str]  # tokenloom distributions this project may import


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _requirement_name(requirement: str) -> str:
    for stop in "[<>=!~; ":
        requirement = requirement.split(stop, 1)[0]
    return _normalise(requirement)


def load_project(root: Path) -> Project:
    data = tomllib.loads((root / "pyproject.toml").read_text())
    project = data.get("project", {})
    distribution = _normalise(project["name"])
    requirements = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        requirements.extend(extra)
    for group in data.get("dependency-groups", {}).values():
        requirements.extend(r for r in group if isinstance(r, str))
    declared = {_requirement_name(r) for r in requirements}
    declared = frozenset(d for d in declared if d == "tokenloom" or d.startswith("tokenloom-"))
    module = data.get("tool", {}).get("uv", {}).get("build-backend", {}).get("module-name")
    import_name = module.split(".", 1)[1] if module and module.startswith("tokenloom.") else None
    return Project(root=root, distribution=distribution, import_name=import_name, declared=declared)


def projects(repo: Path) -> list[Project]:
    roots = [repo, *sorted(p.parent for p in repo.glob("packages/*/pyproject.toml"))]
    if (repo / "integration-tests" / "pyproject.toml").exists():
        roots.append(repo / "integration-tests")
    return [load_project(r) for r in roots if (r / "pyproject.toml").exists()]


def _python_files(project: Project, repo: Path) -> list[Path]:
    if project.root == repo:
        return sorted((repo / "src").rglob("*.py")) if (repo / "src").exists() else []
    return sorted(p for p in project.root.rglob("*.py") if ".venv" not in p.parts and ".tox" not in p.parts)


def check_namespace(repo: Path) -> list[Violation]:
    """PEP 420: no ``src/tokenloom/__init__.py`` anywhere."""
    found = [*repo.glob("packages/*/src/tokenloom/__init__.py"), *repo.glob("src/tokenloom/__init__.py")]
    return [
        Violation(p.relative_to(repo), 1, "tokenloom is a PEP 420 namespace; delete this __init__.py")
        for p in sorted(found)
    ]


def _imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            # `from tokenloom.x import _private` names a private module too
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
    return found


def check_imports(repo: Path) -> list[Violation]:
    """Each project imports only declared tokenloom packages, and no other package's privates."""
    violations: list[Violation] = []
    all_projects = projects(repo)
    by_import = {p.import_name: p for p in all_projects if p.import_name}
    for project in all_projects:
        for path in _python_files(project, repo):
            tree = ast.parse(path.read_text(), filename=str(path))
            for line, module in _imported_modules(tree):
                parts = module.split(".")
                if parts[0] != "tokenloom" or len(parts) < 2:
                    continue
                target = by_import.get(parts[1])
                rel = path.relative_to(repo)
                if target is None:
                    violations.append(
                        Violation(rel, line, f"imports 'tokenloom.{parts[1]}', which no workspace project provides")
                    )
                    continue
                if target.distribution == project.distribution:
                    continue
                if target.distribution not in project.declared:
                    violations.append(
                        Violation(
                            rel,
                            line,
                            f"imports {module!r} from {target.distribution}, which "
                            f"{project.distribution} does not declare as a dependency",
                        )
                    )
                if any(part.startswith("_") and not part.startswith("__") for part in parts[2:]):
                    violations.append(
                        Violation(
                            rel,
                            line,
                            f"imports private module {module!r} of {target.distribution}; "
                            "import what its __init__ exports instead",
                        )
                    )
    unique = {(v.path, v.line, v.message.split(" ", 1)[0] + str(v.message.count("private"))): v for v in violations}
    return list(unique.values())


#: module -> modules that importing it must not load (checked in a fresh interpreter).
LIGHT_IMPORTS: dict[str, tuple[str, ...]] = {"tokenloom.formats": ("click", "rich")}


def check_light_imports(repo: Path) -> list[Violation]:
    """Import each module of LIGHT_IMPORTS in a fresh interpreter (the repo's sources first on
    its path) and name every forbidden module that the import loaded."""
    violations: list[Violation] = []
    by_import = {p.import_name: p for p in projects(repo) if p.import_name}
    sources = [str(p.root / "src") for p in by_import.values()]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*sources, os.environ.get("PYTHONPATH", "")])}
    for module, forbidden in LIGHT_IMPORTS.items():
        project = by_import.get(module.split(".")[1])
        if project is None:
            continue
        code = (
            f"import importlib, sys\nimportlib.import_module({module!r})\n"
            f"print(' '.join(m for m in {forbidden!r} if m in sys.modules))"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        init = (project.root / "src" / Path(*module.split(".")) / "__init__.py").relative_to(repo)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            violations.append(Violation(init, 1, f"'import {module}' failed: {last}"))
        elif done.stdout.split():
            loaded = ", ".join(done.stdout.split())
            violations.append(
                Violation(init, 1, f"'import {module}' loads {loaded}; keep it out of the import path of {module}")
            )
    return violations


def _line_of(path: Path, needle: str) -> int:
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if needle in line:
            return number
    return 1


def check_versions(repo: Path) -> list[Violation]:
    """One version across the workspace; tokenloom requirements of published projects pinned to it."""
    roots = [p.root for p in projects(repo)]
    data = {root: tomllib.loads((root / "pyproject.toml").read_text()) for root in roots}
    versions = {root: str(d.get("project", {}).get("version", "")) for root, d in data.items()}
    expected = versions[repo] if repo in versions else next(iter(versions.values()), "")
    violations = [
        Violation(
            root.relative_to(repo) / "pyproject.toml",
            _line_of(root / "pyproject.toml", "version ="),
            f"version {version!r} differs from the workspace's {expected!r} (one version for every package: "
            "python tools/release/release.py bump VERSION)",
        )
        for root, version in versions.items()
        if version != expected
    ]
    for root, d in data.items():
        if d.get("tool", {}).get("uv", {}).get("package") is False:
            continue  # not published (integration-tests): its requirements never reach an index
        project = d.get("project", {})
        requirements = list(project.get("dependencies", []))
        for extra in project.get("optional-dependencies", {}).values():
            requirements.extend(extra)
        for requirement in requirements:
            match = re.match(r"\s*([A-Za-z0-9._-]+)\s*(?:\[[^\]]*\])?([^;]*)", requirement)
            name = _normalise(match[1]) if match else ""
            if not (name == "tokenloom" or name.startswith("tokenloom-")):
                continue
            specifier = match[2].replace(" ", "") if match else ""
            if specifier != f"=={expected}":
                violations.append(
                    Violation(
                        root.relative_to(repo) / "pyproject.toml",
                        _line_of(root / "pyproject.toml", f'"{requirement}"'),
                        f"requires {requirement!r}; a tokenloom package requires its siblings at exactly "
                        f"=={expected} (the one version policy)",
                    )
                )
    return violations


def check_cycles(
    repo: Path, packages: list[str] | None = None, allowed: frozenset[frozenset[str]] = ALLOWED_CYCLES
) -> list[Violation]:
    """No import cycle inside any package (or inside the packages named), beyond ``allowed``: see import_cycles."""
    return [
        Violation(
            cycle.file.relative_to(repo),
            cycle.lines[0],
            f"{cycle.describe()}; move what both need into a module of its own, or pass the value in",
        )
        for cycle in disallowed(find_cycles(repo, packages), allowed)
    ]


#: Names replaced by ``train_type`` / ``format`` / ``path``; kept only where marked with ``OLD_NAME_MARKER``.
OLD_NAMES = {"training_type": "train_type", "storage_type": "format", "load_path": "path"}
OLD_NAME_MARKER = "# old-name"
#: An identifier holding an old name (``training_type``, ``TRAINING_TYPE_KEYS``; not ``download_path``).
_OLD_NAME = re.compile(r"(?<![a-z0-9])(?:\w*_)?(" + "|".join(OLD_NAMES) + r")\w*", re.IGNORECASE)


def check_vocabulary(repo: Path) -> list[Violation]:
    """No ``training_type`` / ``storage_type`` / ``load_path`` (any case, e.g. ``TRAINING_TYPE_KEYS``) in
    package sources outside lines marked ``# old-name``."""
    violations = []
    for path in sorted(repo.glob("packages/*/src/**/*.py")):
        relative = path.relative_to(repo)
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found = _OLD_NAME.search(line)
            if found is None or OLD_NAME_MARKER in line:
                continue
            old = found.group(1)
            new = OLD_NAMES[old.lower()]
            violations.append(
                Violation(
                    relative,
                    number,
                    f"{found.group(0)!r} uses the old name {old!r}: say {new!r} (keep an old name only in "
                    f"DatasetFactory's seed API, on a line marked {OLD_NAME_MARKER!r})",
                )
            )
    return violations


#: The tokenize modules that may name --num-nodes / --node-rank; the others read ``config.nodes``.
NODE_ROOMS = frozenset({"_commands.py", "_config.py", "_unit_files.py", "_publish.py"})
NODE_NAMES = frozenset({"num_nodes", "node_rank"})


def check_node_settings(repo: Path) -> list[Violation]:
    """``num_nodes`` / ``node_rank`` as a name, attribute, argument or keyword only in NODE_ROOMS of tokenize."""
    violations = []
    for path in sorted(repo.glob("packages/tokenize/src/tokenloom/tokenize/**/*.py")):
        if path.name in NODE_ROOMS and path.parent.name == "tokenize":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = getattr(node, "id", None) or getattr(node, "attr", None) or getattr(node, "arg", None)
            if name in NODE_NAMES:
                message = f"{name!r} outside {sorted(NODE_ROOMS)}: read the frozen config.nodes value instead"
                violations.append(Violation(path.relative_to(repo), node.lineno, message))
    return violations


SELF = {"tools/checks/repo_checks.py", "tools/checks/test_repo_checks.py"}  # they name the patterns
ARTIFACT_SUFFIXES = (".whl", ".egg", ".so", ".pyd", ".dylib", ".tar.gz", ".pyc")
_MACHINE_PATH = re.compile(r"(?<![\w.])(/work/|/root/|/home/[a-z_][\w-]*/|/tmp/pytest-of-)")


def _tracked_files(repo: Path) -> list[Path]:
    """The files git tracks (every file under ``repo``, minus dot-directories, outside a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "ls-files", "-z"], capture_output=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return [p.relative_to(repo) for p in repo.rglob("*") if p.is_file() and not _generated(p.relative_to(repo))]
    return [Path(name) for name in out.decode().split("\0") if name]


def _generated(relative: Path) -> bool:
    """Outside git: what a checkout would not track (dot-directories, bytecode caches)."""
    return any(part.startswith(".") or part == "__pycache__" for part in relative.parts[:-1])


def check_machine_specific(repo: Path) -> list[Violation]:
    """No tracked build artifact and no absolute path of this machine in a tracked text file."""
    violations = []
    for relative in _tracked_files(repo):
        if relative.name.endswith(ARTIFACT_SUFFIXES):
            violations.append(
                Violation(relative, 1, "a built artifact is tracked: remove it (git rm --cached) and build it instead")
            )
            continue
        if relative.name == "uv.lock" or relative.as_posix() in SELF:
            continue
        try:
            text = (repo / relative).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary data (test fixtures) or a file deleted in the work tree
        for number, line in enumerate(text.splitlines(), 1):
            found = _MACHINE_PATH.search(line)
            if found is not None:
                violations.append(
                    Violation(
                        relative,
                        number,
                        f"{found.group(1)!r} is a path of one machine: use a path relative to the repository, "
                        "tmp_path, or an environment variable",
                    )
                )
    return violations


def run(repo: Path) -> list[Violation]:
    return [
        *check_namespace(repo),
        *check_imports(repo),
        *check_light_imports(repo),
        *check_versions(repo),
        *check_cycles(repo),
        *check_vocabulary(repo),
        *check_machine_specific(repo),
        *check_node_settings(repo),
        *(Violation(*found) for found in check_format_branches(repo)),
    ]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    repo = Path(args[0]) if args else Path(__file__).resolve().parents[2]
    violations = run(repo)
    for v in violations:
        print(v)
    checked = len(projects(repo))
    if violations:
        print(f"repo checks: {len(violations)} violation(s) in {checked} projects")
        return 1
    print(f"repo checks: {checked} projects clean")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
