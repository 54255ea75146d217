"""Review attacks on the recorded node count (issue 35 item 3): a finished run rerun with any count, trees."""

from __future__ import annotations

from typing import Any

import pytest

from tokenloom.formats import ConfigError, open_dataset
from tokenloom.tokenize import Layout, TokenizeConfig, tokenize

NODES_NAME = ".tokenloom-nodes.json"


def _corpus(jsonl_dir, make_texts):
    texts = make_texts(120, seed=5)
    return jsonl_dir({f"part{i}.jsonl": [{"text": t} for t in texts[i * 30 : (i + 1) * 30]] for i in range(4)})


def _run(corpus, out, tokenizer, **extra: Any):
    return tokenize(TokenizeConfig(input_dir=corpus, output_dir=out, tokenizer=str(tokenizer), num_workers=0, **extra))


def test_a_finished_run_is_complete_under_any_count(tmp_path, tiny_tokenizer, jsonl_dir, make_texts):
    corpus, out = _corpus(jsonl_dir, make_texts), tmp_path / "out"
    for rank in range(2):
        _run(corpus, out, tiny_tokenizer, num_nodes=2, node_rank=rank)
    before = sorted((p.name, p.read_bytes()) for p in out.iterdir())
    assert not any(name == NODES_NAME or name.endswith(".finished") for name, _ in before)
    for extra in ({"num_nodes": 3, "node_rank": 2}, {}, {"finalize": True, "num_nodes": 5}):
        assert _run(corpus, out, tiny_tokenizer, **extra).already_complete  # the dataset does not depend on N
    assert sorted((p.name, p.read_bytes()) for p in out.iterdir()) == before


def test_a_tree_node_with_another_count_is_refused_and_the_records_go(tmp_path, tiny_tokenizer, make_texts):
    raw = tmp_path / "raw"
    for b, bucket in enumerate(("code", "web")):
        (raw / "train" / bucket).mkdir(parents=True)
        (raw / "train" / bucket / "a.jsonl").write_text("".join(f'{{"text": "{t}"}}\n' for t in make_texts(40, seed=b)))
    out = tmp_path / "out"
    tree: dict[str, Any] = {"layout": Layout.TREE, "unit_bytes": 2000}
    _run(raw, out, tiny_tokenizer, num_nodes=2, node_rank=0, **tree)
    with pytest.raises(ConfigError, match="planned for --num-nodes 2"):
        _run(raw, out, tiny_tokenizer, num_nodes=3, node_rank=1, **tree)
    _run(raw, out, tiny_tokenizer, num_nodes=2, node_rank=1, **tree)
    leftovers = [p for p in out.rglob("*") if p.name == NODES_NAME or p.name.endswith(".finished")]
    assert leftovers == []
    assert all(len(open_dataset(out / "train" / b)) > 0 for b in ("code", "web"))
