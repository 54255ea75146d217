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

Run: ``python tools/checks/repo_checks.py [ROOT]``; exits 1 and lists every
violation.
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


def run(repo: Path) -> list[Violation]:
    return [*check_namespace(repo), *check_imports(repo), *check_light_imports(repo), *check_versions(repo)]


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
