"""The release checks: the real wheels pass, broken ones are caught, each wheel installs alone,
and the README's install commands work in a clean venv.

Run: ``uv run pytest tools/release -q -p no:cacheprovider`` (CI: ``tox -e release``). The
install tests need uv and the package registry (third-party dependencies; uv's cache makes
torch a hardlink).
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import release

REPO = release.REPO
POLICY = release.load_policy(REPO)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out_dir = tmp_path_factory.mktemp("release") / "dist"
    release.build(REPO, out_dir)
    return out_dir


def wheel_of(dist: Path, name: str) -> Path:
    return dist / f"{POLICY.projects[name].file_stem}-py3-none-any.whl"


def rewrite_wheel(source: Path, target: Path, edits: dict[str, bytes | None]) -> Path:
    """A copy of ``source`` with members replaced, added or (None) removed, and a RECORD to match."""
    with zipfile.ZipFile(source) as wheel:
        members = {n: wheel.read(n) for n in wheel.namelist() if not n.endswith("/")}
    record = next(n for n in members if n.endswith(".dist-info/RECORD"))
    for name, data in edits.items():
        if data is None:
            members.pop(name, None)
        else:
            members[name] = data
    lines = []
    for name, data in members.items():
        if name != record:
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            lines.append(f"{name},sha256={digest},{len(data)}")
    members[record] = ("\n".join([*lines, f"{record},,"]) + "\n").encode()
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w") as wheel:
        for name, data in members.items():
            wheel.writestr(name, data)
    return target


def metadata_name(name: str) -> str:
    return f"{name.replace('-', '_')}-{POLICY.version}.dist-info/METADATA"


def edited_metadata(dist: Path, name: str, old: str, new: str) -> bytes:
    with zipfile.ZipFile(wheel_of(dist, name)) as wheel:
        text = wheel.read(metadata_name(name)).decode()
    assert old in text
    return text.replace(old, new, 1).encode()


def test_every_built_wheel_and_sdist_passes(dist: Path) -> None:
    assert sorted(p.name for p in dist.glob("*.whl")) == sorted(
        f"{p.file_stem}-py3-none-any.whl" for p in POLICY.projects.values()
    )
    assert release.check_dist_dir(dist, POLICY) == []


def test_all_packages_share_one_version() -> None:
    assert {p.version for p in POLICY.projects.values()} == {POLICY.version}
    assert len(POLICY.projects) == 1 + len(list(REPO.glob("packages/*/pyproject.toml")))


def test_wrong_version_is_rejected(dist: Path, tmp_path: Path) -> None:
    meta = edited_metadata(dist, "tokenloom-formats", f"Version: {POLICY.version}", "Version: 0.0.9")
    bad = rewrite_wheel(
        wheel_of(dist, "tokenloom-formats"),
        tmp_path / wheel_of(dist, "tokenloom-formats").name,
        {metadata_name("tokenloom-formats"): meta},
    )
    problems = release.check_wheel(bad, POLICY)
    assert problems == [f"{bad.name}: Version is '0.0.9', the policy says '{POLICY.version}'"]


def test_missing_module_is_rejected(dist: Path, tmp_path: Path) -> None:
    source = wheel_of(dist, "tokenloom-sampler")
    bad = rewrite_wheel(source, tmp_path / source.name, {"tokenloom/sampler/__init__.py": None})
    problems = release.check_wheel(bad, POLICY)
    assert problems == [f"{bad.name}: no tokenloom/sampler/__init__.py (the module tokenloom.sampler is missing)"]


def test_stray_files_and_a_namespace_init_are_rejected(dist: Path, tmp_path: Path) -> None:
    source = wheel_of(dist, "tokenloom-formats")
    bad = rewrite_wheel(
        source,
        tmp_path / source.name,
        {
            "tokenloom/__init__.py": b"",
            "tokenloom/formats/tests/test_x.py": b"",
            "tokenloom/formats/manifest.json.tmp": b"{}",
            "tokenloom/formats/__pycache__/x.cpython-311.pyc": b"",
            "conftest.py": b"",
        },
    )
    problems = "\n".join(release.check_wheel(bad, POLICY))
    assert "ships tokenloom/__init__.py (tokenloom is a PEP 420 namespace)" in problems
    assert "stray file tokenloom/formats/tests/test_x.py" in problems
    assert "stray file tokenloom/formats/manifest.json.tmp" in problems
    assert "stray file tokenloom/formats/__pycache__/x.cpython-311.pyc" in problems
    assert "stray file conftest.py (outside tokenloom/formats/" in problems


def test_this_machines_path_is_rejected(dist: Path, tmp_path: Path) -> None:
    source = wheel_of(dist, "tokenloom-tokenize")
    leak = f"DEFAULT = {str(REPO / 'packages' / 'tokenize')!r}\n".encode()
    bad = rewrite_wheel(source, tmp_path / source.name, {"tokenloom/tokenize/_where.py": leak})
    assert release.check_wheel(bad, POLICY) == [
        f"{bad.name}: tokenloom/tokenize/_where.py contains this machine's path {REPO}"
    ]


def test_unpinned_sibling_and_missing_licence_and_readme_are_rejected(dist: Path, tmp_path: Path) -> None:
    source = wheel_of(dist, "tokenloom-sampler")
    with zipfile.ZipFile(source) as wheel:
        text = wheel.read(metadata_name("tokenloom-sampler")).decode()
    head, _, _ = text.partition("\n\n")
    head = head.replace(f"tokenloom-formats=={POLICY.version}", "tokenloom-formats>=0.1")
    head = "\n".join(line for line in head.splitlines() if not line.startswith(("License-Expression", "Description")))
    bad = rewrite_wheel(source, tmp_path / source.name, {metadata_name("tokenloom-sampler"): (head + "\n").encode()})
    problems = "\n".join(release.check_wheel(bad, POLICY))
    assert f"requires 'tokenloom-formats>=0.1'; tokenloom packages are pinned to =={POLICY.version}" in problems
    assert "no License-Expression" in problems
    assert "no readme" in problems


def test_missing_command_entry_points_are_rejected(dist: Path, tmp_path: Path) -> None:
    source = wheel_of(dist, "tokenloom-tokenize")
    entry_points = f"tokenloom_tokenize-{POLICY.version}.dist-info/entry_points.txt"
    bad = rewrite_wheel(source, tmp_path / source.name, {entry_points: None})
    assert release.check_wheel(bad, POLICY) == [
        f"{bad.name}: tokenloom.commands entry points [], the pyproject declares ['index', 'pack', 'tokenize']"
    ]


def test_bad_sdist_is_rejected(dist: Path, tmp_path: Path) -> None:
    source = dist / f"{POLICY.projects['tokenloom-datasets'].file_stem}.tar.gz"
    top = f"{POLICY.projects['tokenloom-datasets'].file_stem}/"
    bad = tmp_path / source.name
    with tarfile.open(source) as old, tarfile.open(bad, "w:gz") as new:
        for info in old.getmembers():
            if info.name != top + "README.md":
                new.addfile(info, old.extractfile(info) if info.isfile() else None)
        stray = tarfile.TarInfo(top + "tests/test_x.py")
        new.addfile(stray, io.BytesIO(b""))
    problems = release.check_sdist(bad, POLICY)
    assert problems == [f"{bad.name}: no {top}README.md", f"{bad.name}: stray file {top}tests/test_x.py"]


def test_dist_dir_with_a_missing_wheel_fails(dist: Path, tmp_path: Path) -> None:
    partial = tmp_path / "dist"
    shutil.copytree(dist, partial)
    wheel_of(partial, "tokenloom-curriculum").unlink()
    assert release.check_dist_dir(partial, POLICY) == [
        f"{partial}: no {POLICY.projects['tokenloom-curriculum'].file_stem}-py3-none-any.whl"
    ]


def test_a_wheel_that_does_not_import_fails_the_install_check(dist: Path, tmp_path: Path) -> None:
    broken = tmp_path / "dist"
    shutil.copytree(dist, broken)
    init = b"from tokenloom.formats._gone import nothing  # a module left out of the wheel\n"
    rewrite_wheel(
        wheel_of(dist, "tokenloom-formats"),
        wheel_of(broken, "tokenloom-formats"),
        {"tokenloom/formats/__init__.py": init},
    )
    assert release.check_wheel(wheel_of(broken, "tokenloom-formats"), POLICY) == []  # metadata alone cannot tell
    problems = release.install_check("tokenloom-formats", POLICY, broken, tmp_path)
    assert len(problems) >= 1
    assert problems[0].startswith("tokenloom-formats: import tokenloom.formats failed:")
    assert "No module named 'tokenloom.formats._gone'" in problems[0]


@pytest.mark.parametrize("name", sorted(POLICY.projects))
def test_each_wheel_installs_alone_and_imports(dist: Path, tmp_path: Path, name: str) -> None:
    assert release.install_check(name, POLICY, dist, tmp_path) == []


def test_bump_moves_every_version_and_pin(tmp_path: Path) -> None:
    for root in [*release.published_roots(REPO), REPO / "integration-tests"]:
        target = tmp_path / root.relative_to(REPO) / "pyproject.toml"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / "pyproject.toml", target)
    changed = release.bump(tmp_path, "0.2.0")
    assert len(changed) == len(POLICY.projects) + 1
    bumped = release.load_policy(tmp_path)
    assert bumped.version == "0.2.0"
    sys.path.insert(0, str(REPO / "tools" / "checks"))
    repo_checks = importlib.import_module("repo_checks")
    assert repo_checks.check_versions(tmp_path) == []
    assert f"=={POLICY.version}" not in (tmp_path / "pyproject.toml").read_text()


# ---- the README's Install section, run as written in clean venvs ----------------------------------------


def readme_install_commands() -> list[str]:
    """The `uv pip install` lines of the README's Install section, comments stripped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", readme_install_section(), flags=re.S):
        for line in block.splitlines():
            command = line.split("  #", 1)[0].strip()
            if command.startswith("uv pip install"):
                commands.append(command)
    return commands


def readme_install_section() -> str:
    return (REPO / "README.md").read_text().split("\n## Install\n", 1)[1].split("\n## ", 1)[0]


def test_readme_install_section_covers_every_package() -> None:
    """A line per package, or the `./packages/<folder>` rule (each wheel's own install is tested above)."""
    commands = readme_install_commands()
    assert "uv pip install ." in commands
    assert "`uv pip install ./packages/<folder>`" in readme_install_section()
    assert any(c.startswith("uv pip install --no-sources ./packages/") for c in commands)
    assert any("git+https://github.com/OWNER/tokenloom#subdirectory=packages/" in c for c in commands)


@pytest.mark.parametrize("command", readme_install_commands())
def test_readme_install_command_works_in_a_clean_venv(command: str, tmp_path: Path) -> None:
    """Each line in its own fresh venv, from the checkout's root; a git URL reads this repository's HEAD."""
    uv = release.uv_binary()
    venv = tmp_path / "venv"
    subprocess.run(
        [uv, "venv", "--quiet", "--python", f"{sys.version_info.major}.{sys.version_info.minor}", str(venv)], check=True
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "VIRTUAL_ENV", "UV_PROJECT", "UV_PYTHON", "UV_NO_SOURCES", "UV_SYSTEM"))
    }
    env["VIRTUAL_ENV"] = str(venv)
    runnable = command.replace("https://github.com/OWNER/tokenloom", REPO.as_uri())
    args = [uv if word == "uv" else word.strip('"') for word in re.findall(r'"[^"]*"|\S+', runnable)]
    installed = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert installed.returncode == 0, installed.stderr
    listing = subprocess.run(
        [uv, "pip", "list", "--format", "freeze", "--python", str(venv / "bin" / "python")],
        capture_output=True,
        text=True,
        check=True,
    )
    present = {release.normalise(line.split("==")[0]) for line in listing.stdout.splitlines() if "==" in line}
    named = {release.normalise(m) for m in re.findall(r"(?:packages/)([a-z-]+)", command)}
    expected = {f"tokenloom-{n}" for n in named} | (
        {"tokenloom"} if re.search(r"install \.$|tokenloom @", command) else set()
    )
    assert expected, command
    assert expected <= present, (command, sorted(present))
    modules = [POLICY.projects[name].module for name in sorted(expected)]
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    imported = subprocess.run(
        [str(venv / "bin" / "python"), "-I", "-c", "; ".join(f"import {m}" for m in modules)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert imported.returncode == 0, imported.stderr


def test_a_lazily_exported_module_left_out_of_the_wheel_fails_the_install_check(dist: Path, tmp_path: Path) -> None:
    # `import tokenloom.sampler` imports no submodule (lazy exports), so the check must resolve every public name
    broken = tmp_path / "dist"
    shutil.copytree(dist, broken)
    rewrite_wheel(
        wheel_of(dist, "tokenloom-sampler"),
        wheel_of(broken, "tokenloom-sampler"),
        {"tokenloom/sampler/_sampler.py": None},
    )
    problems = release.install_check("tokenloom-sampler", POLICY, broken, tmp_path)
    assert len(problems) == 1
    assert problems[0].startswith("tokenloom-sampler: import tokenloom.sampler failed:")
    assert "No module named 'tokenloom.sampler._sampler'" in problems[0]


def test_a_wheel_missing_a_source_file_or_asset_is_rejected(dist: Path, tmp_path: Path) -> None:
    # imports cannot tell: the tokenizer is read only when used, py.typed only by a type checker
    source = wheel_of(dist, "tokenloom-tokenize")
    asset = "tokenloom/tokenize/assets/stdlib-bpe-16k/tokenizer.json"
    bad = rewrite_wheel(source, tmp_path / source.name, {asset: None, "tokenloom/tokenize/py.typed": None})
    assert release.check_wheel(bad, POLICY) == [
        f"{bad.name}: misses {asset} (in the project's source tree, not in the wheel)",
        f"{bad.name}: misses tokenloom/tokenize/py.typed (in the project's source tree, not in the wheel)",
    ]
