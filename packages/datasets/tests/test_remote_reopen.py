"""A DataLoader worker's reopen (after pickling) reaches the store and the cache exactly as the user's open did:
the dataset carries its RemoteOptions (``dataset.remote``) and the reopen uses that value, not options rebuilt
by probing its shards for a block cache (which is how a copy of the option names lost ``cache_limit`` once).
"""

from __future__ import annotations

import pickle
import uuid
from pathlib import Path

import numpy as np
import pytest

from tokenloom.datasets import MemoryMappedDataset
from tokenloom.formats import RemoteOptions, open_dataset, open_writer

BLOCK = 64 << 10


def _write(root: Path, fmt: str) -> None:
    rng = np.random.default_rng(0)
    with open_writer(root, format=fmt, dtype="uint16", vocab_size=1000, eos_id=0) as writer:
        for _ in range(200):
            writer.add(np.append(rng.integers(1, 999, size=int(rng.integers(3, 300))), 0))


@pytest.mark.parametrize("fmt", ["native", "flat"])
def test_a_worker_reopen_keeps_the_credentials_cache_dir_and_limit(seaweed, tmp_path, monkeypatch, fmt):
    local = tmp_path / "local"
    _write(local, fmt)
    url = seaweed.upload_dir(local, f"reopen-{uuid.uuid4().hex[:8]}")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)  # only the user's storage_options can reach the server
    elsewhere = tmp_path / "default-cache"
    monkeypatch.setenv("TOKENLOOM_CACHE_DIR", str(elsewhere))
    cache, limit = tmp_path / "c", 64 * BLOCK * 4
    opened = open_dataset(
        url,
        remote=RemoteOptions.from_keywords(
            storage_options=seaweed.storage_options(), block_cache_dir=cache, block_size=BLOCK, cache_limit=limit
        ),
    )
    ds = MemoryMappedDataset(opened, seq_len=32)
    worker = pickle.loads(pickle.dumps(ds))
    assert worker._dataset is None  # the entry index is not pickled: the worker reopens
    reopened = worker.dataset  # a ConfigError/StorageError here: the credentials were dropped
    assert len(reopened) == len(opened)
    assert [np.asarray(reopened[i]).tolist() for i in range(5)] == [np.asarray(opened[i]).tolist() for i in range(5)]
    assert not elsewhere.exists(), "the reopen cached blocks in the default directory, not the user's cache_dir"
    assert reopened.remote == opened.remote
    assert reopened.remote.cache_limit == limit and reopened.remote.block_cache_dir == cache
