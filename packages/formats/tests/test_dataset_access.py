"""TokenDataset.__getitem__ (the optimised hot path): every index form, every shard, after pickling."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import numpy as np
import pytest
from formats_helpers import fuzz
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenloom.formats import Shard, TokenDataset, _dataset, open_dataset, open_writer


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


@fuzz(60)
@given(
    entry_counts=st.lists(
        st.one_of(st.just(0), st.integers(1, 40), st.integers(200, 3000)),  # empty, small and large shards
        min_size=1,
        max_size=40,
    ).filter(any),
    seed=st.integers(0, 2**16),
)
def test_every_entry_found_whatever_the_shard_sizes(tmp_path: Path, entry_counts: list[int], seed: int) -> None:
    # ds[i] finds the shard from a table of blocks of entries; a block may span empty, small and large shards
    rng = np.random.default_rng(seed)
    shards, docs = [], []
    for k, count in enumerate(entry_counts):
        offsets = np.concatenate([[0], np.cumsum(rng.integers(0, 3, size=count))]).astype(np.int64)
        tokens = rng.integers(0, 1000, size=int(offsets[-1])).astype(np.uint16)
        path = tmp_path / f"{seed}_{k}.bin"
        tokens.tofile(path)
        shards.append(Shard(path, np.dtype("<u2"), len(tokens), offsets, np.zeros(count, np.uint16), name=str(k)))
        docs += [tokens[offsets[i] : offsets[i + 1]].tolist() for i in range(count)]
    ds = TokenDataset(shards, format="native", root=tmp_path)
    assert len(ds) == len(docs)
    probe = sorted({0, len(docs) - 1, *rng.integers(0, len(docs), size=200).tolist()})
    for dataset in (ds, pickle.loads(pickle.dumps(ds)), copy.copy(ds)):
        for i in probe:
            assert dataset[i].tolist() == docs[i]
            assert dataset[i - len(docs)].tolist() == docs[i]
        for bad in (len(docs), -len(docs) - 1):
            with pytest.raises(IndexError, match="out of range"):
                dataset[bad]


@settings(max_examples=150, deadline=None)
@given(
    entry_counts=st.lists(st.one_of(st.just(0), st.integers(1, 3), st.integers(1, 300)), min_size=1, max_size=60),
    blocks_per_shard=st.integers(1, 8),
    max_blocks=st.integers(1, 64),
    data=st.data(),
)
def test_entry_lookup_matches_a_linear_reference_under_any_block_table(
    entry_counts: list[int], blocks_per_shard: int, max_blocks: int, data: st.DataObject
) -> None:
    # a capped table (few blocks, many shards each, runs of empty shards) takes the bisect path most of the time
    shards, owner = [], []
    for k, count in enumerate(entry_counts):
        first = len(owner)
        tokens = np.arange(first, first + count, dtype=np.int64)  # entry i is the one token i
        offsets = np.arange(count + 1, dtype=np.int64)
        shards.append(
            Shard(Path(f"{k}.bin"), np.dtype("<i8"), count, offsets, np.zeros(count, np.uint16), _tokens=tokens)
        )
        owner += [k] * count
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_dataset, "_BLOCKS_PER_SHARD", blocks_per_shard)
        patch.setattr(_dataset, "_MAX_BLOCKS", max_blocks)
        ds = TokenDataset(shards, format="native", root=".")
    length = len(owner)
    assert len(ds) == length
    probe = list(range(length)) if length <= 400 else data.draw(st.lists(st.integers(0, length - 1), max_size=400))
    for i in probe:
        for index in (i, i - length, np.int64(i), np.int32(i - length)):
            assert ds[index].tolist() == [i]  # pyright: ignore[reportArgumentType]  # numpy ints index too
    for bad in (length, -length - 1, np.int64(length), 2**64):
        with pytest.raises(IndexError, match=f"entry {bad} out of range"):
            ds[bad]  # pyright: ignore[reportArgumentType]
