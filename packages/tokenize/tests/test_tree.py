"""--layout tree and --val-fraction: IN/<split>/<bucket>/ -> OUT/<split>/<bucket>/ datasets in one run."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import pytest
import xxhash
from tokenize_helpers import BUCKETS, write_texts

from tokenloom.formats import ConfigError, ResumeMismatchError, open_dataset
from tokenloom.formats.io import WRITING_MARKER
from tokenloom.tokenize import Layout, TokenizeConfig, tokenize

OPTIONS = {"shard_size_tokens": 3000, "seq_len": 64, "overlap_size": 8}
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _config(raw: Path, out: Path, tokenizer: Path, **extra: object) -> TokenizeConfig:
    values = {**OPTIONS, "layout": Layout.TREE, **extra}
    return TokenizeConfig(input_dir=raw, output_dir=out, tokenizer=str(tokenizer), **values)  # type: ignore[arg-type]


def _texts(directory: Path) -> list[str]:
    texts = []
    for path in sorted(directory.rglob("*.jsonl")):
        texts += [orjson.loads(line)["text"] for line in path.read_bytes().splitlines()]
    return texts


def test_a_tree_becomes_one_dataset_per_leaf_each_the_bytes_of_its_own_run(
    raw: Path, tmp_path: Path, tiny_tokenizer: Path, make_texts: Callable[..., list[str]], tree_digest
) -> None:
    write_texts(raw / "val" / "web" / "v.jsonl", make_texts(50, seed=30))
    out = tmp_path / "out"
    summary = tokenize(_config(raw, out, tiny_tokenizer, num_workers=2))
    assert sorted(str(p.relative_to(out)) for p in out.glob("*/*")) == ["train/code", "train/web", "val/web"]
    assert summary.datasets == ["train/code", "train/web", "val/web"]
    for leaf in ("train/code", "train/web", "val/web"):
        alone = tmp_path / "alone" / leaf
        tokenize(TokenizeConfig(input_dir=raw / leaf, output_dir=alone, tokenizer=str(tiny_tokenizer), num_nodes=1,
                                num_workers=0, **OPTIONS))  # type: ignore[arg-type]  # fmt: skip
        mine, theirs = tree_digest(out / leaf), tree_digest(alone)
        # the shards are the same bytes; the plan and manifest also name the leaf
        assert {k: v for k, v in mine.items() if k.startswith("unit_")} == {
            k: v for k, v in theirs.items() if k.startswith("unit_")
        }
        assert open_dataset(out / leaf).num_tokens == open_dataset(alone).num_tokens
    assert summary.tokens == sum(open_dataset(out / leaf).num_tokens for leaf in ("train/code", "train/web", "val/web"))
    assert tokenize(_config(raw, out, tiny_tokenizer, num_workers=0)).already_complete


def test_val_fraction_carves_documents_by_seeded_hash_the_same_on_any_executor(
    raw: Path, tmp_path: Path, tiny_tokenizer: Path, tree_digest
) -> None:
    one = tmp_path / "one"
    tokenize(_config(raw, one, tiny_tokenizer, num_workers=0, val_fraction=0.2, seed=3))
    two = tmp_path / "two"
    tokenize(_config(raw, two, tiny_tokenizer, num_workers=2, val_fraction=0.2, seed=3, unit_bytes=5000))
    nodes = tmp_path / "nodes"
    args = [
        sys.executable, "-m", "tokenloom.formats", "tokenize", f"--input-dir={raw}", f"--output-dir={nodes}",
        f"--tokenizer={tiny_tokenizer}", "--layout=tree", "--val-fraction=0.2", "--seed=3", "--num-nodes=2",
        "--num-workers=0", "--no-progress", *(f"--{k.replace('_', '-')}={v}" for k, v in OPTIONS.items()),
    ]  # fmt: skip
    for rank in (0, 1):
        subprocess.run([*args, f"--node-rank={rank}"], env=ENV, check=True, capture_output=True)
    for bucket in BUCKETS:
        for split in ("train", "val"):
            assert tree_digest(nodes / split / bucket) == tree_digest(one / split / bucket)
        train, val = open_dataset(one / "train" / bucket), open_dataset(one / "val" / bucket)
        texts = _texts(raw / "train" / bucket)
        chosen = [xxhash.xxh3_64_intdigest(t.encode(), 3) < int(0.2 * (1 << 64)) for t in texts]
        assert 0 < sum(chosen) < len(texts)
        assert open_dataset(one / "val" / bucket).fingerprint != open_dataset(one / "train" / bucket).fingerprint
        # the val dataset holds the chosen documents, the train dataset the others, each in input order
        alone = tmp_path / "alone" / bucket
        write_texts(alone / "val" / "a.jsonl", [t for t, c in zip(texts, chosen, strict=True) if c])
        write_texts(alone / "train" / "a.jsonl", [t for t, c in zip(texts, chosen, strict=True) if not c])
        for split, dataset in (("val", val), ("train", train)):
            ref = tmp_path / "ref" / bucket / split
            tokenize(TokenizeConfig(input_dir=alone / split, output_dir=ref, tokenizer=str(tiny_tokenizer),
                                    num_workers=0, **OPTIONS))  # type: ignore[arg-type]  # fmt: skip
            expected = open_dataset(ref)
            assert np.array_equal(dataset.tokens(0, dataset.num_tokens), expected.tokens(0, expected.num_tokens))
    # a unit plan that cuts files differently writes other shard files but the same token streams
    for split in ("train", "val"):
        a, b = open_dataset(one / split / "web"), open_dataset(two / split / "web")
        assert np.array_equal(a.tokens(0, a.num_tokens), b.tokens(0, b.num_tokens))
    with pytest.raises(ResumeMismatchError, match="seed 3 -> 4"):
        tokenize(_config(raw, one, tiny_tokenizer, num_workers=0, val_fraction=0.2, seed=4))


def test_val_fraction_on_a_flat_input_writes_train_and_val(
    tmp_path: Path, tiny_tokenizer: Path, make_texts: Callable[..., list[str]]
) -> None:
    raw = tmp_path / "flat"
    write_texts(raw / "a.jsonl", make_texts(400, seed=1))
    out = tmp_path / "out"
    summary = tokenize(
        TokenizeConfig(input_dir=raw, output_dir=out, tokenizer=str(tiny_tokenizer), val_fraction=0.1, **OPTIONS)  # type: ignore[arg-type]
    )
    train, val = open_dataset(out / "train"), open_dataset(out / "val")
    assert 0 < val.num_tokens < train.num_tokens
    assert summary.documents == 400


def test_files_outside_split_bucket_and_a_val_split_with_val_fraction_are_config_errors(
    raw: Path, tmp_path: Path, tiny_tokenizer: Path, make_texts: Callable[..., list[str]]
) -> None:
    write_texts(raw / "train" / "stray.jsonl", make_texts(5))
    with pytest.raises(ConfigError, match=r"input train/stray\.jsonl is not inside a <split>/<bucket>/"):
        tokenize(_config(raw, tmp_path / "a", tiny_tokenizer))
    (raw / "train" / "stray.jsonl").unlink()
    write_texts(raw / "val" / "web" / "v.jsonl", make_texts(5))
    with pytest.raises(ConfigError, match="already has a val split"):
        tokenize(_config(raw, tmp_path / "b", tiny_tokenizer, val_fraction=0.1))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    with pytest.raises(ConfigError, match="val_fraction is 1.0"):
        _config(raw, tmp_path / "c", tiny_tokenizer, val_fraction=1.0)


def test_a_rerun_after_a_kill_between_the_train_and_val_manifests_only_finishes_val(
    raw: Path, tmp_path: Path, tiny_tokenizer: Path, tree_digest
) -> None:
    out = tmp_path / "out"
    tokenize(_config(raw, out, tiny_tokenizer, num_workers=0, val_fraction=0.2))
    reference = tree_digest(out / "val" / "web")
    train_manifest = (out / "train" / "web" / "manifest.json").stat()
    (out / "val" / "web" / "manifest.json").unlink()  # killed after train/web's manifest, before val/web's
    (out / "val" / "web" / WRITING_MARKER).touch()
    summary = tokenize(_config(raw, out, tiny_tokenizer, num_workers=0, val_fraction=0.2))
    assert summary.run_tokens == 0  # every unit was committed (val before train): nothing is encoded again
    assert tree_digest(out / "val" / "web") == reference
    assert (out / "train" / "web" / "manifest.json").stat().st_mtime_ns == train_manifest.st_mtime_ns


def test_nodes_are_dealt_units_across_the_leaves_of_a_tree(
    tmp_path: Path, tiny_tokenizer: Path, make_texts: Callable[..., list[str]], tree_digest
) -> None:
    """Three leaves of one unit each on 3 nodes: each node encodes one leaf (dealt per leaf, node 0 took all three
    and nodes 1 and 2 had nothing to do); the result is the bytes of one process."""
    raw = tmp_path / "raw"
    leaves = ("train/a", "train/b", "val/a")
    for n, leaf in enumerate(leaves):
        write_texts(raw / leaf / "part.jsonl", make_texts(60, seed=40 + n))
    out, alone = tmp_path / "out", tmp_path / "alone"
    encoded = []
    for rank in range(3):
        summary = tokenize(_config(raw, out, tiny_tokenizer, num_workers=0, num_nodes=3, node_rank=rank))
        encoded.append(summary.units_committed)
    assert encoded == [1, 1, 1]  # one unit each: the last node to finish also wrote the manifests
    tokenize(_config(raw, alone, tiny_tokenizer, num_workers=0, num_nodes=1))
    for leaf in leaves:
        assert tree_digest(out / leaf) == tree_digest(alone / leaf)
