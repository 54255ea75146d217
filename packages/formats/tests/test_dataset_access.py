"""TokenDataset.__getitem__ (the optimised hot path): every index form, every shard, after pickling."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from tokenloom.formats import open_dataset, open_writer


def test_random_access_across_shards_matches_the_documents(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 1000, size=int(n)).tolist() for n in rng.integers(0, 12, size=300)]
    with open_writer(tmp_path / "ds", format="native", dtype="uint16", shard_size_tokens=40) as writer:
        for doc in docs:
            writer.add(doc)
    ds = open_dataset(tmp_path / "ds")
    assert ds.num_shards > 20
    for i in rng.permutation(len(docs)).tolist():
        assert ds[i].tolist() == docs[i]
        assert ds[i - len(docs)].tolist() == docs[i]
        assert ds[np.int64(i)].tolist() == docs[i]  # type: ignore[index]
    for bad in (len(docs), -len(docs) - 1):
        with pytest.raises(IndexError, match="out of range"):
            ds[bad]
    clone = pickle.loads(pickle.dumps(ds))  # the cached offset views are dropped and rebuilt
    assert [clone[i].tolist() for i in range(len(docs))] == docs
