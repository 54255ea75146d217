"""One remote open path: the lazy open is a property of a format's spec (``FormatSpec.remote``), not of its name."""

from __future__ import annotations

import dataclasses
import uuid

import numpy as np
import pytest

from tokenloom.formats import RemoteOptions, _registry, open_dataset, open_writer

BLOCK = 4096


def _native(seaweed, tmp_path, format: str = "native") -> str:
    local = tmp_path / "local"
    sizes = {"shard_size_tokens": 4000} if format == "native" else {}
    with open_writer(local, format=format, dtype="uint16", vocab_size=1000, eos_id=0, **sizes) as w:
        for seed in range(60):
            w.add(np.append(np.random.default_rng(seed).integers(1, 999, size=50 + seed), 0))
    return seaweed.upload_dir(local, f"path-{uuid.uuid4().hex[:8]}")


def _spec(monkeypatch: pytest.MonkeyPatch, **changes: object) -> None:
    monkeypatch.setitem(_registry._FORMATS, "native", dataclasses.replace(_registry._FORMATS["native"], **changes))


def test_the_spec_says_whether_a_format_opens_lazily_and_both_ways_agree(seaweed, tmp_path, monkeypatch):
    url = _native(seaweed, tmp_path)
    options = seaweed.storage_options()
    lazy = open_dataset(
        url,
        remote=RemoteOptions.from_keywords(
            storage_options=options, block_cache_dir=tmp_path / "lazy", block_size=BLOCK
        ),
    )
    assert not list((tmp_path / "lazy").rglob("view-*"))  # off the manifest: no view, no index fetched yet
    calls = []
    native = _registry._FORMATS["native"]
    _spec(monkeypatch, remote=lambda *a, **k: calls.append(1) or native.remote(*a, **k))  # pyright: ignore
    open_dataset(
        url,
        remote=RemoteOptions.from_keywords(
            storage_options=options, block_cache_dir=tmp_path / "again", block_size=BLOCK
        ),
    )
    assert calls == [1]  # the opener asks the spec, whatever the format's name
    flat = _native(seaweed, tmp_path / "flat", format="flat")  # flat's spec has no remote reader
    viewed = open_dataset(
        flat,
        remote=RemoteOptions.from_keywords(
            storage_options=options, block_cache_dir=tmp_path / "view", block_size=BLOCK
        ),
    )
    assert not list((tmp_path / "view").rglob("view-*"))  # its own reader on the listing: no local view
    assert len(viewed) == len(lazy) and all(np.array_equal(viewed[i], lazy[i]) for i in range(len(lazy)))
