"""One remote open path: the lazy open is a property of a format's spec (``FormatSpec.remote``), not of its name."""

from __future__ import annotations

import uuid

import numpy as np

from tokenloom.formats import RemoteOptions, open_dataset, open_writer

BLOCK = 4096


def _native(seaweed, tmp_path, format: str = "native") -> str:
    local = tmp_path / "local"
    sizes = {"shard_size_tokens": 4000} if format == "native" else {}
    with open_writer(local, format=format, dtype="uint16", vocab_size=1000, eos_id=0, **sizes) as w:
        for seed in range(60):
            w.add(np.append(np.random.default_rng(seed).integers(1, 999, size=50 + seed), 0))
    return seaweed.upload_dir(local, f"path-{uuid.uuid4().hex[:8]}")


def test_every_format_opens_on_the_one_path_and_native_stays_lazy(seaweed, tmp_path):
    url = _native(seaweed, tmp_path)
    options = seaweed.storage_options()
    lazy = open_dataset(
        url,
        remote=RemoteOptions.from_keywords(
            storage_options=options, block_cache_dir=tmp_path / "lazy", block_size=BLOCK
        ),
    )
    assert not list((tmp_path / "lazy").rglob("view-*"))  # off the manifest: no view, no index fetched yet
    assert not list((tmp_path / "lazy").rglob("b4096-*"))  # no index block fetched before a shard is touched
    flat = _native(seaweed, tmp_path / "flat", format="flat")
    viewed = open_dataset(
        flat,
        remote=RemoteOptions.from_keywords(
            storage_options=options, block_cache_dir=tmp_path / "view", block_size=BLOCK
        ),
    )
    assert not list((tmp_path / "view").rglob("view-*"))  # its own reader on the listing: no local view
    assert len(viewed) == len(lazy) and all(np.array_equal(viewed[i], lazy[i]) for i in range(len(lazy)))
