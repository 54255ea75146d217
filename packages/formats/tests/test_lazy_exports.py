"""lazy_exports: a package names its exports and imports each on first use (no torch for --help)."""

from __future__ import annotations

import sys
import types

import pytest

from tokenloom.formats.io import lazy_exports


def test_an_export_is_imported_on_first_use_and_then_cached(tmp_path, monkeypatch):
    (tmp_path / "lazy_probe_source.py").write_text("VALUE = object()\nLOADS = []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    package = types.ModuleType("lazy_probe_package")
    names = ["VALUE"]
    package.__getattr__, package.__dir__ = lazy_exports(  # type: ignore[attr-defined]
        "lazy_probe_package", {"VALUE": "lazy_probe_source"}, package.__dict__, names
    )
    assert "lazy_probe_source" not in sys.modules
    value = package.VALUE
    assert value is sys.modules["lazy_probe_source"].VALUE
    assert package.__dict__["VALUE"] is value  # the next look-up does not come back to __getattr__
    assert "VALUE" in dir(package)
    with pytest.raises(AttributeError, match="lazy_probe_package.*has no attribute 'OTHER'"):
        _ = package.OTHER
