"""A tokenize output of many shards in object storage: a window index over it fetches no `.idx` at construction.

A native dataset written by `tokenloom tokenize` with overlap_size 0 records that in its manifest, so every
overlap prefix is known to be 0 without the shards' indices; a window dataset over thousands of remote shards
then starts from the manifest alone (it used to fetch every `.idx`, one GET each, before the first batch).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson

from tokenloom.datasets import MemoryMappedDataset
from tokenloom.formats import RemoteOptions, open_dataset
from tokenloom.tokenize import TokenizeConfig, build_stdlib_corpus, default_tokenizer_path, tokenize


def _tokenized(tmp_path: Path, overlap_size: int) -> Path:
    corpus = tmp_path / "corpus"
    build_stdlib_corpus(corpus, modules=["textwrap", "string", "difflib", "json", "csv", "http"], min_chars=40)
    out = tmp_path / f"tok-{overlap_size}"
    config = TokenizeConfig(
        input_dir=corpus,
        output_dir=out,
        tokenizer=str(default_tokenizer_path()),
        num_workers=0,
        shard_size_tokens=500,
        seq_len=128,
        overlap_size=overlap_size,
    )
    tokenize(config)
    return out


def _upload(seaweed, local: Path, name: str) -> str:
    for path in sorted(local.iterdir()):
        if path.is_file():
            seaweed.put(f"{name}/{path.name}", path.read_bytes())
    return f"s3://{seaweed.bucket}/{name}"


def test_a_window_index_over_remote_shards_fetches_no_idx_when_the_manifest_rules_out_overlaps(
    seaweed, fault_proxy, tmp_path
):
    local = _tokenized(tmp_path, overlap_size=0)
    shards = sorted(local.glob("unit_*.idx"))
    assert len(shards) >= 5, "the corpus should make several shards"
    url = _upload(seaweed, local, "many-shards")
    options = RemoteOptions.from_keywords(
        storage_options=seaweed.storage_options(fault_proxy.url), block_cache_dir=tmp_path / "cache"
    )
    remote = MemoryMappedDataset(url, 32, remote=options)
    assert fault_proxy.gets_of(".idx") == 0, "constructing the window index fetched shard indices"
    here = MemoryMappedDataset(open_dataset(local), 32)
    assert len(remote) == len(here)
    for index in range(0, len(here), max(1, len(here) // 50)):
        assert np.array_equal(np.asarray(remote[index]["input_ids"]), np.asarray(here[index]["input_ids"]))


def test_with_overlaps_the_indices_are_read_and_the_windows_still_match(seaweed, fault_proxy, tmp_path):
    local = _tokenized(tmp_path, overlap_size=16)
    url = _upload(seaweed, local, "overlapping-shards")
    options = RemoteOptions.from_keywords(
        storage_options=seaweed.storage_options(fault_proxy.url), block_cache_dir=tmp_path / "cache"
    )
    remote = MemoryMappedDataset(url, 32, remote=options)
    assert fault_proxy.gets_of(".idx") == len(list(local.glob("unit_*.idx")))  # overlaps must be read
    here = MemoryMappedDataset(open_dataset(local), 32)
    assert len(remote) == len(here)
    for index in range(0, len(here), max(1, len(here) // 50)):
        assert np.array_equal(np.asarray(remote[index]["input_ids"]), np.asarray(here[index]["input_ids"]))


def test_any_native_writer_records_its_largest_overlap_so_remote_readers_skip_the_indices(
    seaweed, fault_proxy, tmp_path
):
    from tokenloom.formats import open_writer

    rng = np.random.default_rng(7)
    docs = [rng.integers(1, 1000, size=int(n), dtype=np.int64) for n in rng.integers(5, 80, size=40)]
    for name, overlap in (("plain", 0), ("overlapped", 3)):
        local = tmp_path / name
        with open_writer(local, format="native", dtype="uint16", vocab_size=1000, eos_id=0, shard_size_tokens=200) as w:
            for doc in docs:
                w.add(doc, overlap_prefix=overlap)
        assert orjson.loads((local / "manifest.json").read_bytes())["metadata"]["max_overlap_prefix"] == overlap
        url = _upload(seaweed, local, f"writer-{name}")
        fault_proxy.gets.clear()
        remote = MemoryMappedDataset(
            url,
            16,
            remote=RemoteOptions.from_keywords(
                storage_options=seaweed.storage_options(fault_proxy.url), block_cache_dir=tmp_path / f"cache-{name}"
            ),
        )
        fetched = fault_proxy.gets_of(".idx")
        assert fetched == (0 if overlap == 0 else len(list(local.glob("shard_*.idx"))))
        here = MemoryMappedDataset(open_dataset(local), 16)
        assert len(remote) == len(here)
        for index in range(len(here)):
            assert np.array_equal(np.asarray(remote[index]["input_ids"]), np.asarray(here[index]["input_ids"]))
            assert np.array_equal(np.asarray(remote[index]["labels"]), np.asarray(here[index]["labels"]))
