"""tokenize's manifests record the block hashes of every .bin (one run path for one process and for units)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tokenloom.formats.io import file_digests
from tokenloom.formats.io.manifest import read_manifest
from tokenloom.tokenize import TokenizeConfig, tokenize
from tokenloom.tokenize._shards import ShardRecord

OPTIONS = {"shard_size_tokens": 3000, "max_length": 64, "overlap_size": 8, "num_workers": 0}


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
    assert record.bin_blocks is None and record.bin_entry("s").blocks is None
    assert ShardRecord.from_json(record.to_json()) == record
