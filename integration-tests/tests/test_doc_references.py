"""Every ``tokenloom.<package>.<name>`` a Markdown file names (prose or ``from ... import``) exists.

A module move (issue 22 split formats into folders) must not leave docs pointing at names users
can no longer import; the failure lists each stale reference as ``file:line name``.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"formats", "tokenize", "sampler", "datasets", "curriculum", "hf_streaming", "eval_broadcast", "testing"}
DOTTED = re.compile(r"(?<![\w/])(tokenloom(?:\.[A-Za-z_]\w*)+)")
FROM_IMPORT = re.compile(r"^\s*from (tokenloom(?:\.\w+)+) import \(?([\w, ]+)", re.MULTILINE)


def _markdown() -> list[Path]:
    skip = {".venv", "node_modules", ".git", ".tox"}
    return sorted(p for p in ROOT.rglob("*.md") if not skip & set(p.relative_to(ROOT).parts))


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def _references(text: str) -> list[tuple[int, str]]:
    found = []
    for match in DOTTED.finditer(text):
        dotted = match.group(1)
        if dotted.split(".")[1] in PACKAGES and not dotted.endswith((".py", ".md", ".json", ".yaml")):
            found.append((text.count("\n", 0, match.start()) + 1, dotted))
    for match in FROM_IMPORT.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        for name in match.group(2).split(","):
            name = name.strip().split(" as ")[0].strip()
            if name.isidentifier():
                found.append((line, f"{match.group(1)}.{name}"))
    return found


def test_every_tokenloom_name_in_the_docs_exists():
    stale = [
        f"{path.relative_to(ROOT)}:{line} {dotted}"
        for path in _markdown()
        for line, dotted in _references(path.read_text(encoding="utf-8", errors="replace"))
        if not _resolves(dotted)
    ]
    assert not stale, "Markdown names tokenloom objects that do not exist:\n" + "\n".join(stale)
