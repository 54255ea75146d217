"""The demo corpus from the standard library's docstrings."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tokenloom.formats import ConfigError
from tokenloom.tokenize import build_stdlib_corpus


def test_corpus_is_deterministic_sorted_and_long_enough(tmp_path: Path) -> None:
    first = build_stdlib_corpus(tmp_path / "a", modules=["json", "textwrap", "string"])
    second = build_stdlib_corpus(tmp_path / "b", modules=["string", "textwrap", "json"])
    assert first.sha256 == second.sha256 and first.documents > 10
    rows = [orjson.loads(line) for line in first.path.read_bytes().splitlines()]
    ids = [row["id"] for row in rows]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(set(row) == {"id", "text"} and len(row["text"]) >= 200 for row in rows)
    assert "json" in ids and "textwrap.TextWrapper" in ids and "json.decoder.JSONDecoder.__init__" in ids
    assert not list(first.path.parent.glob("*.tmp"))


def test_min_chars_filters_and_is_validated(tmp_path: Path) -> None:
    short = build_stdlib_corpus(tmp_path / "a", modules=["json"], min_chars=20)
    long = build_stdlib_corpus(tmp_path / "b", modules=["json"], min_chars=2000)
    assert short.documents > long.documents
    with pytest.raises(ConfigError):
        build_stdlib_corpus(tmp_path / "c", min_chars=0)


def test_modules_with_side_effects_are_never_imported(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    info = build_stdlib_corpus(tmp_path, modules=["this", "antigravity", "idlelib", "tkinter", "test", "no_such_mod"])
    assert info.documents == 0
    out, _ = capfd.readouterr()
    assert "Beautiful is better than ugly" not in out
