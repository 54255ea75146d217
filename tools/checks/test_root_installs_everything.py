"""The root `tokenloom` package is the "installs everything" one: every extra of every package is requested."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_root_requests_every_extra_of_every_package() -> None:
    root = tomllib.loads((REPO / "pyproject.toml").read_text())
    requested: dict[str, set[str]] = {}
    for requirement in root["project"]["dependencies"]:
        match = re.match(r"([A-Za-z0-9_.-]+)(?:\[([^\]]*)\])?", requirement)
        assert match is not None, requirement
        requested[match[1]] = {e.strip() for e in (match[2] or "").split(",") if e.strip()}
    missing = []
    for pyproject in sorted(REPO.glob("packages/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        for extra in project.get("optional-dependencies", {}):
            if extra not in requested.get(project["name"], set()):
                missing.append(f"{project['name']}[{extra}]")
    assert not missing, f"the root pyproject does not install: {missing}"
