"""The one registry: a third-party format plugs in through the ``tokenloom.formats`` entry points.

The plugin is a real distribution on ``sys.path`` (a module and its ``.dist-info`` with an
``entry_points.txt``), found by ``importlib.metadata`` as pip would have installed it.
"""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tokenloom.formats import (
    ConfigError,
    FormatError,
    Validate,
    _registry,
    available_formats,
    detect_format,
    open_dataset,
    open_store,
)

TOY_MODULE = '''
"""A toy format: b"TOY1" then little-endian uint16 tokens, one entry per file."""
from pathlib import Path

import numpy as np

from tokenloom.formats import FormatSpec, Shard, TokenDataset, Validate

SEEN = []


def is_toy(path: Path) -> bool:
    return path.is_file() and path.suffix == ".toy" and path.read_bytes()[:4] == b"TOY1"


def open_toy(path: Path, *, validate: Validate = Validate.FAST, dtype=None, eos_id=None) -> TokenDataset:
    SEEN.append(validate)
    count = (path.stat().st_size - 4) // 2
    shard = Shard(
        tokens_path=path,
        dtype=np.dtype("<u2"),
        num_tokens=count,
        offsets=np.array([0, count], dtype=np.int64),
        overlap_prefix=np.zeros(1, dtype=np.uint16),
        tokens_offset=4,
        name=path.name,
    )
    return TokenDataset([shard], format="toy", root=path.parent, eos_id=eos_id)


SPEC = FormatSpec(name="toy", description="toy tokens", detect=is_toy, open=open_toy, options=("eos_id",))
'''


def _install(site: Path, *, module: str, entry: str) -> None:
    """A distribution ``toy-tokens`` on ``site``: its module and a dist-info declaring ``entry``."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "toy_tokens.py").write_text(textwrap.dedent(module))
    info = site / "toy_tokens-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-tokens\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[tokenloom.formats]\ntoy = {entry}\n")


@pytest.fixture
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The built-in formats only, with the entry points not read yet (restored afterwards)."""
    _registry._import_folders()  # registered when first asked for
    monkeypatch.setattr(_registry, "_FORMATS", dict(_registry._FORMATS))
    monkeypatch.setattr(_registry, "_plugins_loaded", False)
    monkeypatch.setattr(_registry, "_PLUGIN_ORIGINS", {})
    monkeypatch.delitem(__import__("sys").modules, "toy_tokens", raising=False)


def test_a_format_from_an_entry_point_opens_a_dataset(tmp_path, monkeypatch, fresh_registry):
    _install(tmp_path / "site", module=TOY_MODULE, entry="toy_tokens:SPEC")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    data = tmp_path / "one.toy"
    data.write_bytes(b"TOY1" + np.array([5, 6, 7, 0], dtype="<u2").tobytes())

    assert "toy" in available_formats()
    assert detect_format(data) == "toy"
    dataset = open_dataset(data, validate="deep", eos_id=0)
    assert dataset[0].tolist() == [5, 6, 7, 0] and dataset.eos_id == 0
    import toy_tokens  # pyright: ignore[reportMissingImports]  # the plugin module, written in tmp_path and loaded by the registry

    assert toy_tokens.SEEN == [Validate.DEEP] and type(toy_tokens.SEEN[0]) is Validate  # the enum, not a string
    with pytest.raises(ConfigError, match="do not apply to format 'toy'"):
        open_dataset(data, vocab_size=10)


def test_an_unknown_format_lists_the_valid_ones_plugins_included(tmp_path, monkeypatch, fresh_registry):
    _install(tmp_path / "site", module=TOY_MODULE, entry="toy_tokens:SPEC")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(ConfigError, match=r"unknown format 'parquet', expected one of \[.*'native'.*'toy'"):
        open_dataset(tmp_path, format="parquet")
    with pytest.raises(ConfigError, match=r"unknown storage type 'parquet', expected one of \['bin', 'h5'\]"):
        open_store(tmp_path, "parquet")


def test_a_plugin_that_does_not_load_is_a_named_error(tmp_path, monkeypatch, fresh_registry):
    _install(tmp_path / "site", module="raise RuntimeError('broken plugin')\n", entry="toy_tokens:SPEC")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(ConfigError, match=r"format plugin 'toy' \(toy_tokens:SPEC\) failed to load: RuntimeError"):
        available_formats()


def test_a_plugin_that_is_not_a_format_spec_is_a_named_error(tmp_path, monkeypatch, fresh_registry):
    _install(tmp_path / "site", module="SPEC = {'name': 'toy'}\n", entry="toy_tokens:SPEC")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(ConfigError, match="gave a dict, expected a FormatSpec"):
        detect_format(tmp_path)


def test_every_builtin_spec_lists_exactly_the_options_its_reader_takes():
    for name, spec in available_formats().items():
        parameters = set(inspect.signature(spec.open).parameters) - {"path", "validate", "dtype"}
        assert parameters == set(spec.options), name


def test_an_unregistered_path_still_lists_the_readers_tried(tmp_path):
    (tmp_path / "notes.txt").write_text("not tokens")
    with pytest.raises(FormatError, match=r"tried bin-meta, flat, h5, megatron, native, packed\)"):
        detect_format(tmp_path)


def test_a_plugin_named_like_a_builtin_is_a_named_error_and_the_builtin_stays(tmp_path, monkeypatch, fresh_registry):
    clash = TOY_MODULE.replace('FormatSpec(name="toy"', 'FormatSpec(name="native"')
    _install(tmp_path / "site", module=clash, entry="toy_tokens:SPEC")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    builtin = _registry._FORMATS["native"]
    with pytest.raises(ConfigError, match=r"format plugin 'toy' \(toy_tokens:SPEC\) registers 'native'.*built in"):
        available_formats()
    assert _registry._FORMATS["native"] is builtin


def test_a_plugin_that_failed_fails_again_instead_of_vanishing(tmp_path, monkeypatch, fresh_registry):
    _install(tmp_path / "site", module="raise RuntimeError('broken plugin')\n", entry="toy_tokens:SPEC")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for _ in range(2):  # the second ask must not answer as if the plugin had never been declared
        with pytest.raises(ConfigError, match="failed to load: RuntimeError"):
            open_dataset(tmp_path, format="toy")


def test_a_plugin_detector_that_raises_is_named_and_format_skips_it(tmp_path, monkeypatch, fresh_registry):
    sloppy = TOY_MODULE.replace(
        "    return path.is_file() and", "    path.read_bytes()  # fails on a directory\n    return"
    )
    _install(tmp_path / "site", module=sloppy, entry="toy_tokens:SPEC")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    from tokenloom.formats import open_writer

    with open_writer(tmp_path / "tokens", format="native", dtype="uint16", vocab_size=10, eos_id=0) as writer:
        writer.add([1, 2, 0])
    # not a StorageError about the user's (healthy) directory: the plugin is named, and format= is the way round
    with pytest.raises(
        ConfigError, match=r"the detector of format plugin 'toy' \(toy_tokens:SPEC\) raised IsADirectoryError"
    ):
        open_dataset(tmp_path / "tokens")
    assert open_dataset(tmp_path / "tokens", format="native")[0].tolist() == [1, 2, 0]
