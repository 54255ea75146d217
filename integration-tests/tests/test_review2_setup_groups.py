"""Review 2: the README set-up commands read against pyproject's groups and extras (no install is run).

Every `uv sync/run --group G` in a README or the demo's hint names a dependency group of the root; every
`--extra E` / `pkg[E]` install line names an extra the package declares; tokenloom-testing is the default
group `remote`, never an extra or a runtime dependency of a shipped package.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pyproject(path: Path) -> dict:
    return tomllib.loads((path / "pyproject.toml").read_text())


def _readmes() -> list[Path]:
    return [ROOT / "README.md", *sorted(ROOT.glob("packages/*/README.md")), *sorted(ROOT.glob("docs/**/*.md"))]


def test_the_testing_member_is_the_default_group_remote_and_no_extra() -> None:
    root = _pyproject(ROOT)
    assert root["dependency-groups"]["remote"] == ["tokenloom-testing"]
    assert "remote" in root["tool"]["uv"]["default-groups"]
    assert "remote" not in root["project"].get("optional-dependencies", {})
    for package in sorted(ROOT.glob("packages/*/pyproject.toml")):
        project = tomllib.loads(package.read_text())["project"]
        if project["name"] == "tokenloom-testing":
            continue
        extras = project.get("optional-dependencies", {}).values()
        runtime = [*project.get("dependencies", []), *(d for extra in extras for d in extra)]
        assert not [d for d in runtime if d.startswith("tokenloom-testing")], package
    assert not any(d.startswith("tokenloom-testing") for d in root["project"]["dependencies"])


def test_every_group_a_doc_or_the_demo_hint_names_exists() -> None:
    groups = set(_pyproject(ROOT)["dependency-groups"])
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in _readmes()}
    texts["src/tokenloom/demo/_command.py"] = (ROOT / "src/tokenloom/demo/_command.py").read_text()
    named = {
        (where, g) for where, text in texts.items() for g in re.findall(r"uv (?:sync|run)[^`\n]*?--group (\w+)", text)
    }
    assert named, "no `--group` found: the pattern is wrong"
    assert {(where, g) for where, g in named if g not in groups} == set()
    assert "uv sync --group remote" in texts["src/tokenloom/demo/_command.py"]


def test_no_doc_names_the_gone_root_remote_extra() -> None:
    found = [str(p.relative_to(ROOT)) for p in _readmes() if re.search(r"tokenloom\[[^\]]*remote", p.read_text())]
    assert found == []


def test_every_extra_an_install_line_names_exists() -> None:
    extras = {}
    for package in sorted(ROOT.glob("packages/*")):
        if (package / "pyproject.toml").is_file():
            extras[package.name] = set(_pyproject(package)["project"].get("optional-dependencies", {}))
    missing = []
    for readme in _readmes():
        for folder, wanted in re.findall(r"\./packages/([\w-]+)\[([\w,-]+)\]", readme.read_text()):
            for extra in wanted.split(","):
                if extra not in extras.get(folder, set()):
                    missing.append((str(readme.relative_to(ROOT)), folder, extra))
    assert missing == []
