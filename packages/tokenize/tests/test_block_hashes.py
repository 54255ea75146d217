"""tokenize's manifests record the block hashes of every .bin (one run path for one process and for units)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tokenloom.formats.io import file_digests
from tokenloom.formats.io.manifest import read_manifest
from tokenloom.tokenize import TokenizeConfig, tokenize
from tokenloom.tokenize._shards import ShardRecord

OPTIONS = {"shard_size_tokens": 3000, "seq_len": 64, "overlap_size": 8, "num_workers": 0}


@pytest.mark.parametrize("nodes", [None, 1])
def test_every_bin_in_the_manifest_has_its_block_hashes(
    jsonl_dir: Callable[..., Path], make_texts: Callable[..., list[str]], tmp_path: Path, tiny_tokenizer: Path, nodes
) -> None:
    corpus = jsonl_dir({f"part-{i}.jsonl": [{"text": t} for t in make_texts(120, seed=i)] for i in range(3)})
    out = tmp_path / "out"
    extra = {} if nodes is None else {"num_nodes": nodes}
    tokenize(TokenizeConfig(input_dir=corpus, output_dir=out, tokenizer=str(tiny_tokenizer), **OPTIONS, **extra))  # type: ignore[arg-type]
    data = [f for f in read_manifest(out).files if f.role == "data"]
    assert len(data) >= 2
    for entry in data:
        checksum, blocks = file_digests(out / entry.name)
        assert (entry.xxh3_128, entry.blocks) == (checksum, blocks)


def test_a_shard_record_journaled_before_block_hashes_still_loads() -> None:
    old = {"index": 0, "num_tokens": 5, "num_entries": 1, "bin_bytes": 10, "bin_xxh3_128": "a" * 32}
    record = ShardRecord.from_json({**old, "idx_bytes": 40, "idx_xxh3_128": "b" * 32})
    assert record.bin_blocks is None and record.entries("s")[1].blocks is None
    assert ShardRecord.from_json(record.to_json()) == record


def test_nodes_with_workers_into_s3_record_the_block_hashes_of_the_uploaded_bins(
    seaweed, jsonl_dir, make_texts, tmp_path: Path, tiny_tokenizer: Path, monkeypatch
) -> None:
    """Two nodes, two worker processes each, into a bucket: the manifest's hashes are those of the objects."""
    import uuid

    import obstore
    import orjson
    from obstore.store import S3Store

    from tokenloom.formats.io.blockhash import hash_blocks

    corpus = jsonl_dir({f"part-{i}.jsonl": [{"text": t} for t in make_texts(100, seed=i)] for i in range(4)})
    for name, value in {**seaweed.env, "AWS_ENDPOINT_URL": seaweed.endpoint, "AWS_ALLOW_HTTP": "true"}.items():
        monkeypatch.setenv(name, value)
    prefix = f"tok-{uuid.uuid4().hex[:8]}"
    for rank in (0, 1):
        monkeypatch.setenv("TOKENLOOM_CACHE_DIR", str(tmp_path / f"cache-{rank}"))
        config = {**OPTIONS, "num_workers": 2, "num_nodes": 2, "node_rank": rank}
        tokenize(
            TokenizeConfig(
                input_dir=corpus,
                output_dir=f"s3://{seaweed.bucket}/{prefix}",  # pyright: ignore[reportArgumentType]  # a URL is accepted
                tokenizer=str(tiny_tokenizer),
                **config,  # pyright: ignore[reportArgumentType]  # the test's options, each of its field's type
            )
        )
    store = S3Store(seaweed.bucket, **seaweed.storage_options())  # pyright: ignore[reportArgumentType]
    manifest = orjson.loads(bytes(obstore.get(store, f"{prefix}/manifest.json").bytes()))
    data = [f for f in manifest["files"] if f["role"] == "data"]
    assert len(data) >= 2
    for entry in data:
        uploaded = bytes(obstore.get(store, f"{prefix}/{entry['name']}").bytes())
        assert (entry["block_size"], entry["block_xxh3_64"]) == (1 << 20, hash_blocks(uploaded)), entry["name"]
