"""Build every tokenloom wheel and sdist, check them, and install each wheel alone.

The release checks a published workspace needs, in one script that CI runs:

1. ``uv build --all-packages --out-dir DIR``: one wheel and one sdist per published project
   (the root meta-package ``tokenloom`` and every ``packages/*``).
2. Metadata: name and version equal to the one version policy (every project shares one
   version, and a tokenloom dependency is pinned to exactly that version), licence,
   requires-python, readme, the ``tokenloom.commands`` entry points the pyproject declares,
   no absolute path of the build machine, no stray files (tests, ``.tmp``, bytecode, a
   ``tokenloom/__init__.py`` that would break the PEP 420 namespace).
3. Install: for each wheel a clean ``uv venv`` that receives that wheel and the built wheels
   of its tokenloom dependencies (given as files, so a same-named project on an index can
   never win) with third-party dependencies from the registry; then import it, check that
   only the expected tokenloom distributions are present (and no torch where the package
   promises none), and run ``tokenloom --help`` where it adds commands.

Run: ``uv run python tools/release/release.py [--out-dir DIR] [--skip-install]``; prints a
summary and exits 1 on any failure. ``release.py bump 0.2.0`` moves every version and pin.
"""

from __future__ import annotations

import argparse
import email.parser
import email.policy
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# distributions a data-prep box installs: they must not pull in torch (DESIGN.md)
NO_TORCH = frozenset({"tokenloom-formats", "tokenloom-tokenize"})
STRAY_PARTS = frozenset({"tests", "test", "__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache", ".venv"})
STRAY_SUFFIXES = (".tmp", ".pyc", ".pyo", ".rej", ".swp", ".DS_Store", ".tokenloom-lock")
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*([^;]*?)\s*(?:;\s*(.*))?$")


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True, slots=True)
class Project:
    """One published project, as its pyproject.toml declares it."""

    root: Path
    name: str  # normalised distribution name
    version: str
    module: str  # import name, e.g. "tokenloom.formats"
    commands: frozenset[str]  # its tokenloom.commands entry points
    scripts: frozenset[str]

    @property
    def file_stem(self) -> str:
        return f"{self.name.replace('-', '_')}-{self.version}"


@dataclass(frozen=True, slots=True)
class Policy:
    """The one version every published project shares."""

    version: str
    projects: dict[str, Project]


def published_roots(repo: Path) -> list[Path]:
    roots = [repo, *sorted(p.parent for p in repo.glob("packages/*/pyproject.toml"))]
    return [r for r in roots if (r / "pyproject.toml").exists()]


def load_project(root: Path) -> Project:
    data = tomllib.loads((root / "pyproject.toml").read_text())
    project = data["project"]
    module = data.get("tool", {}).get("uv", {}).get("build-backend", {}).get("module-name")
    if not module:
        raise SystemExit(f"{root / 'pyproject.toml'}: no [tool.uv.build-backend] module-name")
    entry_points = project.get("entry-points", {})
    return Project(
        root=root,
        name=normalise(project["name"]),
        version=str(project["version"]),
        module=module,
        commands=frozenset(entry_points.get("tokenloom.commands", {})),
        scripts=frozenset(project.get("scripts", {})),
    )


def load_policy(repo: Path) -> Policy:
    """The policy from the pyproject files; a divergence is a failure of its own (repo checks)."""
    projects = {p.name: p for p in map(load_project, published_roots(repo))}
    versions = sorted({p.version for p in projects.values()})
    if len(versions) != 1:
        found = ", ".join(f"{p.name} {p.version}" for p in projects.values())
        raise SystemExit(f"release: the packages do not share one version ({found}); run release.py bump VERSION")
    return Policy(version=versions[0], projects=projects)


def parse_requirement(text: str) -> tuple[str, set[str], str, str]:
    """(name, extras, version specifier, marker) of a Requires-Dist line."""
    match = _REQUIREMENT.match(text)
    if match is None:
        return normalise(text), set(), "", ""
    name, extras, specifier, marker = match.groups()
    extra_set = {e.strip() for e in (extras or "").strip("[]").split(",") if e.strip()}
    return normalise(name), extra_set, specifier.replace(" ", ""), marker or ""


def _marker_extra(marker: str) -> str | None:
    match = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
    return match[1] if match else None


def _check_metadata(label: str, text: str, project: Project, policy: Policy, repo: Path) -> list[str]:
    meta = email.parser.Parser(policy=email.policy.compat32).parsestr(text)
    problems = []
    if normalise(meta.get("Name", "")) != project.name:
        problems.append(f"{label}: Name is {meta.get('Name')!r}, expected {project.name!r}")
    if meta.get("Version") != policy.version:
        problems.append(f"{label}: Version is {meta.get('Version')!r}, the policy says {policy.version!r}")
    for field in ("Summary", "Requires-Python"):
        if not meta.get(field):
            problems.append(f"{label}: no {field}")
    if not (meta.get("License-Expression") or meta.get("License")):
        problems.append(f"{label}: no License-Expression (set `license` in {project.root.name}/pyproject.toml)")
    body = meta.get_payload()
    if not meta.get("Description-Content-Type") or not isinstance(body, str) or not body.strip():
        problems.append(f"{label}: no readme (Description-Content-Type and a description body)")
    for requirement in meta.get_all("Requires-Dist") or []:
        name, _, specifier, _ = parse_requirement(requirement)
        if name.startswith("tokenloom") and specifier != f"=={policy.version}":
            problems.append(
                f"{label}: requires {requirement!r}; tokenloom packages are pinned to =={policy.version} "
                "(the one version policy)"
            )
    if str(repo) in text:
        problems.append(f"{label}: contains this machine's path {repo}")
    return problems


def _stray(member: str) -> bool:
    parts = member.rstrip("/").split("/")
    name = parts[-1]
    return (
        any(part in STRAY_PARTS for part in parts[:-1])
        or name.endswith(STRAY_SUFFIXES)
        or (name.startswith("test_") and name.endswith(".py"))
        or name == "conftest.py"
    )


def _path_leaks(members: dict[str, bytes], repo: Path) -> list[str]:
    needle = str(repo).encode()
    return sorted(m for m, data in members.items() if needle in data)


def _source_files(project: Project) -> list[str]:
    """What the wheel must ship: every file of the module's source tree (code, py.typed, assets such as the
    tokenizer json), as wheel member names; a missing asset would still import and fail only when used."""
    src = project.root / "src"
    module_root = src / project.module.replace(".", "/")
    if not module_root.is_dir():
        return []
    found = (p.relative_to(src).as_posix() for p in module_root.rglob("*") if p.is_file())
    return sorted(m for m in found if not _stray(m))


def check_wheel(path: Path, policy: Policy, repo: Path = REPO) -> list[str]:
    """Everything wrong with one wheel, as lines naming the wheel; empty when it is good."""
    label = path.name
    match = re.match(r"^([A-Za-z0-9_.]+)-([^-]+)-.+\.whl$", path.name)
    if match is None:
        return [f"{label}: not a wheel file name"]
    project = policy.projects.get(normalise(match[1]))
    if project is None:
        return [f"{label}: no published project is named {match[1]!r}"]
    problems = []
    if match[2] != policy.version:
        problems.append(f"{label}: file version {match[2]!r}, the policy says {policy.version!r}")
    try:
        with zipfile.ZipFile(path) as wheel:
            members = {n: wheel.read(n) for n in wheel.namelist() if not n.endswith("/")}
    except (zipfile.BadZipFile, OSError) as error:
        return [f"{label}: unreadable ({error})"]
    dist_info = f"{project.name.replace('-', '_')}-{match[2]}.dist-info/"
    module_dir = project.module.replace(".", "/") + "/"
    metadata = members.get(dist_info + "METADATA")
    if metadata is None:
        return [*problems, f"{label}: no {dist_info}METADATA"]
    problems += _check_metadata(label, metadata.decode("utf-8", "replace"), project, policy, repo)
    if module_dir + "__init__.py" not in members:
        problems.append(f"{label}: no {module_dir}__init__.py (the module {project.module} is missing)")
    for member in sorted(members):
        if member == "tokenloom/__init__.py":
            problems.append(f"{label}: ships tokenloom/__init__.py (tokenloom is a PEP 420 namespace)")
        elif not (member.startswith((module_dir, dist_info))):
            problems.append(f"{label}: stray file {member} (outside {module_dir} and {dist_info})")
        elif _stray(member):
            problems.append(f"{label}: stray file {member}")
    problems += [f"{label}: {m} contains this machine's path {repo}" for m in _path_leaks(members, repo)]
    problems += [
        f"{label}: misses {m} (in the project's source tree, not in the wheel)"
        for m in _source_files(project)
        if m not in members and m != module_dir + "__init__.py"  # reported above as the missing module
    ]
    entry_points = members.get(dist_info + "entry_points.txt", b"").decode()
    found = _entry_point_names(entry_points, "tokenloom.commands")
    if found != project.commands:
        problems.append(
            f"{label}: tokenloom.commands entry points {sorted(found)}, "
            f"the pyproject declares {sorted(project.commands)}"
        )
    if _entry_point_names(entry_points, "console_scripts") != project.scripts:
        problems.append(f"{label}: console scripts differ from the pyproject's {sorted(project.scripts)}")
    return problems


def _entry_point_names(text: str, group: str) -> frozenset[str]:
    names, current = set(), None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
        elif current == group and "=" in line:
            names.add(line.split("=", 1)[0].strip())
    return frozenset(names)


def check_sdist(path: Path, policy: Policy, repo: Path = REPO) -> list[str]:
    """Everything wrong with one sdist; empty when it is good."""
    label = path.name
    match = re.match(r"^([A-Za-z0-9_.]+)-([^-]+)\.tar\.gz$", path.name)
    if match is None:
        return [f"{label}: not an sdist file name"]
    project = policy.projects.get(normalise(match[1]))
    if project is None:
        return [f"{label}: no published project is named {match[1]!r}"]
    top = f"{match[1]}-{match[2]}/"
    try:
        with tarfile.open(path) as sdist:
            members = {}
            for info in sdist.getmembers():
                handle = sdist.extractfile(info) if info.isfile() else None
                if handle is not None:
                    members[info.name] = handle.read()
    except (tarfile.TarError, OSError) as error:
        return [f"{label}: unreadable ({error})"]
    problems = []
    if match[2] != policy.version:
        problems.append(f"{label}: file version {match[2]!r}, the policy says {policy.version!r}")
    pkg_info = members.get(top + "PKG-INFO")
    if pkg_info is None:
        return [*problems, f"{label}: no {top}PKG-INFO"]
    problems += _check_metadata(label, pkg_info.decode("utf-8", "replace"), project, policy, repo)
    src = top + "src/" + project.module.replace(".", "/") + "/__init__.py"
    for needed in (top + "pyproject.toml", top + "README.md", src):
        if needed not in members:
            problems.append(f"{label}: no {needed}")
    for member in sorted(members):
        if not member.startswith(top):
            problems.append(f"{label}: {member} outside {top}")
        elif member == top + "src/tokenloom/__init__.py":
            problems.append(f"{label}: ships src/tokenloom/__init__.py (tokenloom is a PEP 420 namespace)")
        elif _stray(member.removeprefix(top)):
            problems.append(f"{label}: stray file {member}")
    problems += [f"{label}: {m} contains this machine's path {repo}" for m in _path_leaks(members, repo)]
    return problems


def check_dist_dir(out_dir: Path, policy: Policy, repo: Path = REPO) -> list[str]:
    """One wheel and one sdist per published project, nothing else, each of them good."""
    problems = []
    for project in policy.projects.values():
        for suffix in ("-py3-none-any.whl", ".tar.gz"):
            if not (out_dir / f"{project.file_stem}{suffix}").exists():
                problems.append(f"{out_dir}: no {project.file_stem}{suffix}")
    for path in sorted(out_dir.iterdir()):
        if path.name.endswith(".whl"):
            problems += check_wheel(path, policy, repo)
        elif path.name.endswith(".tar.gz"):
            problems += check_sdist(path, policy, repo)
        elif path.name != ".gitignore":
            problems.append(f"{out_dir}: unexpected file {path.name}")
    return problems


def uv_binary() -> str:
    found = os.environ.get("UV") or shutil.which("uv")
    if found is None:
        raise SystemExit("release: uv is not on PATH (pip install uv)")
    return found


def build(repo: Path, out_dir: Path) -> None:
    if out_dir.exists():
        shutil.rmtree(out_dir)
    subprocess.run(
        [uv_binary(), "build", "--all-packages", "--no-create-gitignore", "--out-dir", str(out_dir), "--quiet"],
        cwd=repo,
        check=True,
    )


def wheel_requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser(policy=email.policy.compat32).parsestr(archive.read(name).decode())
    return meta.get_all("Requires-Dist") or []


def tokenloom_closure(name: str, policy: Policy, out_dir: Path) -> dict[str, set[str]]:
    """Every tokenloom distribution (with the extras asked of it) that installing ``name`` needs."""
    needed: dict[str, set[str]] = {}
    todo: list[tuple[str, set[str]]] = [(name, set())]
    while todo:
        current, extras = todo.pop()
        known = needed.get(current)
        if known is not None and extras <= known:
            continue
        needed[current] = (known or set()) | extras
        wheel = out_dir / f"{policy.projects[current].file_stem}-py3-none-any.whl"
        for requirement in wheel_requirements(wheel):
            dep, dep_extras, _, marker = parse_requirement(requirement)
            extra = _marker_extra(marker)
            if dep.startswith("tokenloom") and (extra is None or extra in needed[current]):
                todo.append((dep, dep_extras))
    return needed


def _run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False)


def install_check(name: str, policy: Policy, out_dir: Path, work: Path) -> list[str]:
    """Install one wheel (with its tokenloom dependencies' wheels) in a clean venv and use it."""
    project = policy.projects[name]
    venv = work / f"venv-{name}"
    if venv.exists():
        shutil.rmtree(venv)
    uv = uv_binary()
    python = sys.version_info
    made = _run([uv, "venv", "--quiet", "--python", f"{python.major}.{python.minor}", str(venv)], work)
    if made.returncode != 0:
        return [f"{name}: uv venv failed: {made.stderr.strip()}"]
    venv_python = venv / "bin" / "python"
    closure = tokenloom_closure(name, policy, out_dir)
    requirements = []
    for dep, extras in sorted(closure.items()):
        wheel = out_dir / f"{policy.projects[dep].file_stem}-py3-none-any.whl"
        extra = f"[{','.join(sorted(extras))}]" if extras else ""
        requirements.append(f"{dep}{extra} @ {wheel.resolve().as_uri()}")
    installed = _run([uv, "pip", "install", "--quiet", "--python", str(venv_python), *requirements], work)
    if installed.returncode != 0:
        return [f"{name}: installing {name}'s wheel failed:\n{installed.stderr.strip()}"]
    problems = []
    listing = _run([uv, "pip", "list", "--format", "freeze", "--python", str(venv_python)], work)
    present = {normalise(line.split("==", 1)[0]) for line in listing.stdout.splitlines() if "==" in line}
    tokenloom_present = {p for p in present if p.startswith("tokenloom")}
    if tokenloom_present != set(closure):
        problems.append(f"{name}: the venv holds {sorted(tokenloom_present)}, expected {sorted(closure)}")
    if name in NO_TORCH and "torch" in present:
        problems.append(f"{name}: installing it pulled in torch (a data-prep install must not)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env |= {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    imported = _run(
        # every public name, not just the package: lazily exported names import their module on first use
        [
            str(venv_python),
            "-I",
            "-c",
            f"import {project.module} as m; [getattr(m, n) for n in getattr(m, '__all__', ())]; print(m.__file__)",
        ],
        work,
        env,
    )
    if imported.returncode != 0:
        problems.append(f"{name}: import {project.module} failed:\n{imported.stderr.strip()}")
    elif str(venv) not in imported.stdout:
        problems.append(f"{name}: {project.module} was imported from {imported.stdout.strip()}, not the venv")
    if project.commands:
        helped = _run([str(venv / "bin" / "tokenloom"), "--help"], work, env)
        missing = [c for c in sorted(project.commands) if c not in helped.stdout]
        if helped.returncode != 0 or missing:
            problems.append(
                f"{name}: `tokenloom --help` exited {helped.returncode}, missing {missing}:\n"
                f"{helped.stdout}{helped.stderr}".rstrip()
            )
    return problems


def bump(repo: Path, new_version: str) -> list[Path]:
    """Move every project's version and every tokenloom pin to ``new_version``; then run `uv lock`."""
    if not re.fullmatch(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?", new_version):
        raise SystemExit(f"release: {new_version!r} is not a PEP 440 version")
    changed = []
    paths = [r / "pyproject.toml" for r in published_roots(repo)]
    if (repo / "integration-tests" / "pyproject.toml").exists():
        paths.append(repo / "integration-tests" / "pyproject.toml")
    for path in paths:
        text = path.read_text()
        new = re.sub(r'(?m)^version = "[^"]*"', f'version = "{new_version}"', text, count=1)
        new = re.sub(r'("tokenloom(?:-[a-z-]+)?(?:\[[^\]]*\])?)==[^"]*"', rf'\1=={new_version}"', new)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, help="where the wheels and sdists go (default: a temp dir)")
    parser.add_argument("--skip-install", action="store_true", help="build and check metadata only")
    parser.add_argument("--only", action="append", default=[], help="install-check only this distribution")
    parser.add_argument("--repo", type=Path, default=REPO)
    sub = parser.add_subparsers(dest="command")
    bump_parser = sub.add_parser("bump", help="set one new version on every package and pin")
    bump_parser.add_argument("version")
    args = parser.parse_args(argv)
    repo = args.repo.resolve()
    if args.command == "bump":
        for path in bump(repo, args.version):
            print(f"release: {path.relative_to(repo)} -> {args.version}")
        print("release: now run `uv lock` and add a CHANGELOG.md section")
        return 0

    policy = load_policy(repo)
    with tempfile.TemporaryDirectory(prefix="tokenloom-release-") as scratch:
        out_dir = (args.out_dir or Path(scratch) / "dist").resolve()
        started = time.perf_counter()
        build(repo, out_dir)
        print(
            f"release: built {len(list(out_dir.glob('*.whl')))} wheels and sdists of {policy.version} "
            f"in {time.perf_counter() - started:.1f} s into {out_dir}"
        )
        problems = check_dist_dir(out_dir, policy, repo)
        print(f"release: metadata {'ok' if not problems else f'{len(problems)} problem(s)'}")
        if not args.skip_install:
            for name in sorted(args.only or policy.projects):
                started = time.perf_counter()
                found = install_check(normalise(name), policy, out_dir, Path(scratch))
                status = "ok" if not found else "FAILED"
                print(f"release: install {name:<26} {status:<6} {time.perf_counter() - started:5.1f} s")
                problems += found
    for problem in problems:
        print(f"  {problem}")
    if problems:
        print(f"release: {len(problems)} problem(s); fix them before a release")
        return 1
    if args.skip_install or args.only:
        print(f"release: {len(policy.projects)} packages at {policy.version} pass the checks that ran (not all ran)")
    else:
        print(f"release: {len(policy.projects)} packages at {policy.version} are releasable")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
