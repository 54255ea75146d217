"""Nodes started with different --num-nodes are refused by name, and units no node took are reported.

The unit plan's node count is recorded once beside the plan (a file, or an object at a bucket URL);
a node started with another count is a ConfigError naming both, before it takes a unit.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tokenloom.formats import DataError, open_dataset
from tokenloom.tokenize import TokenizeConfig, tokenize
from tokenloom.tokenize._unit_files import done_path

NODES_NAME = ".tokenloom-nodes.json"  # (the record of the node count beside the plan)


def _corpus(jsonl_dir, make_texts) -> Path:
    texts = make_texts(120, seed=5)
    return jsonl_dir({f"part{i}.jsonl": [{"text": t} for t in texts[i * 30 : (i + 1) * 30]] for i in range(4)})


def _node(input_dir: object, out: object, tokenizer: Path, num_nodes: int, rank: int, *extra: str, env=None):
    cli = Path(sys.executable).with_name("tokenloom")
    command = [
        str(cli), "tokenize", "--input-dir", str(input_dir), "--output-dir", str(out), "--tokenizer", str(tokenizer),
        "--num-workers", "0", "--no-progress", "--num-nodes", str(num_nodes), "--node-rank", str(rank), *extra,
    ]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _finish(proc: subprocess.Popen) -> tuple[int, str]:
    output, _ = proc.communicate(timeout=300)
    return proc.returncode, output


def _three_nodes(source: object, out: object, tokenizer: Path, env=None) -> list[tuple[int, str]]:
    """Node 0 with --num-nodes 2 first, then nodes 1 and 2 with --num-nodes 3 at once (real processes)."""
    first = _finish(_node(source, out, tokenizer, 2, 0, env=env))
    late = [_node(source, out, tokenizer, 3, rank, env=env) for rank in (1, 2)]
    return [first, *(_finish(p) for p in late)]


def _check_refused(results: list[tuple[int, str]]) -> None:
    (code0, out0), *late = results
    assert code0 == 0, out0
    assert "2 of 4 units are still to be committed by other nodes" in out0, out0
    for code, output in late:
        assert code == 1, output
        assert "ConfigError: this node was started with --num-nodes 3" in output, output
        assert "planned for --num-nodes 2" in output and "Start every node of this run with --num-nodes 2" in output
        assert "Traceback" not in output, output


def test_nodes_with_another_num_nodes_are_refused_and_finalize_names_the_missing_units(
    tmp_path, tiny_tokenizer, jsonl_dir, make_texts
):
    corpus = _corpus(jsonl_dir, make_texts)
    out = tmp_path / "out"
    _check_refused(_three_nodes(corpus, out, tiny_tokenizer))
    assert not (out / "manifest.json").exists()
    with pytest.raises(
        DataError, match=r"2 of 4 units are not committed yet: 1 \(part1.jsonl\), 3 \(part3.jsonl\)"
    ) as info:
        tokenize(TokenizeConfig(input_dir=corpus, output_dir=out, tokenizer=str(tiny_tokenizer), finalize=True))
    assert "Rerun --node-rank 1 of --num-nodes 2" in str(info.value)  # the recorded count, though none was given
    # node 1 of the recorded count finishes the run: the last node writes the manifest, the node records go
    code, output = _finish(_node(corpus, out, tiny_tokenizer, 2, 1))
    assert code == 0, output
    assert len(open_dataset(out)) > 0
    assert not (out / NODES_NAME).exists() and not list(out.glob("*.finished"))


def test_three_nodes_started_at_once_with_two_counts_leave_no_unit_silently_missing(
    tmp_path, tiny_tokenizer, jsonl_dir, make_texts
):
    """Whichever count is recorded first wins; every node of the other count is the named ConfigError."""
    corpus = _corpus(jsonl_dir, make_texts)
    out = tmp_path / "out"
    counts = (2, 3, 3)
    procs = [_node(corpus, out, tiny_tokenizer, n, rank) for n, rank in zip(counts, (0, 1, 2), strict=True)]
    results = [_finish(p) for p in procs]
    refused = [n for n, (code, _) in zip(counts, results, strict=True) if code != 0]
    assert refused and len(set(refused)) == 1, results  # the nodes of one count, never a mix
    for code, output in results:
        if code != 0:
            assert code == 1 and "ConfigError: this node was started with --num-nodes" in output, output
            assert "--num-nodes 2" in output and "--num-nodes 3" in output, output
    if not (out / "manifest.json").exists():  # what is missing is named, with the nodes to rerun
        with pytest.raises(DataError, match="units are not committed yet") as info:
            tokenize(TokenizeConfig(input_dir=corpus, output_dir=out, tokenizer=str(tiny_tokenizer), finalize=True))
        assert "Rerun --node-rank" in str(info.value)


def test_the_last_node_names_units_no_node_took(tmp_path, tiny_tokenizer, jsonl_dir, make_texts):
    corpus = _corpus(jsonl_dir, make_texts)
    out = tmp_path / "out"

    def node(rank: int):
        config = TokenizeConfig(
            input_dir=corpus, output_dir=out, tokenizer=str(tiny_tokenizer), num_workers=0, num_nodes=2, node_rank=rank
        )
        return tokenize(config)

    node(0)
    done_path(out, 2).unlink()  # a unit of node 0 lost after node 0 finished: no node will take it now
    with pytest.raises(DataError, match=r"every node of --num-nodes 2 has finished, yet 1 of 4 units were taken by no "
                       r"node: 2 \(part2.jsonl\)") as info:  # fmt: skip
        node(1)
    assert "Rerun --node-rank 0 of --num-nodes 2" in str(info.value)
    node(0)  # the rerun the hint names re-encodes the unit, and, last, writes the manifest
    assert len(open_dataset(out)) > 0


def test_a_single_node_run_and_a_three_node_run_leave_the_same_files(tmp_path, tiny_tokenizer, jsonl_dir, make_texts):
    corpus = _corpus(jsonl_dir, make_texts)
    for name, nodes in (("one", 1), ("three", 3)):
        for rank in range(nodes):
            config: dict[str, Any] = {"num_nodes": nodes, "node_rank": rank, "num_workers": 0}
            tokenize(
                TokenizeConfig(input_dir=corpus, output_dir=tmp_path / name, tokenizer=str(tiny_tokenizer), **config)
            )
    one = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert one == sorted(p.name for p in (tmp_path / "three").iterdir())
    for name in one:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "three" / name).read_bytes(), name


def test_nodes_with_another_num_nodes_are_refused_at_a_bucket_url(
    seaweed, tmp_path, tiny_tokenizer, jsonl_dir, make_texts
):
    import os

    corpus = _corpus(jsonl_dir, make_texts)
    env = {**os.environ, **seaweed.env, "AWS_ENDPOINT_URL": seaweed.endpoint, "AWS_ALLOW_HTTP": "true",
           "AWS_REGION": "us-east-1", "TOKENLOOM_CACHE_DIR": str(tmp_path / "cache")}  # fmt: skip
    target = f"s3://{seaweed.bucket}/nodes-{uuid.uuid4().hex[:8]}"
    results = _three_nodes(corpus, target, tiny_tokenizer, env=env)
    _check_refused(results)
    assert f"[file {target}/{NODES_NAME}, field 'num_nodes']" in results[1][1], results[1][1]
    finalize = subprocess.run(
        [str(Path(sys.executable).with_name("tokenloom")), "tokenize", "--input-dir", str(corpus), "--output-dir",
         target, "--tokenizer", str(tiny_tokenizer), "--finalize", "--no-progress"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert finalize.returncode == 1
    assert "2 of 4 units are not committed at" in finalize.stdout + finalize.stderr
    assert "Rerun --node-rank 1 of --num-nodes 2" in finalize.stdout + finalize.stderr
    # node 1 of the recorded count finishes the run; the node count's object goes with the manifest's arrival
    code, output = _finish(_node(corpus, target, tiny_tokenizer, 2, 1, env=env))
    assert code == 0, output
    assert "manifest.json" in _names_at(seaweed, target)
    assert NODES_NAME not in _names_at(seaweed, target)


def _names_at(seaweed, url: str) -> set[str]:
    import obstore
    from obstore.store import S3Store

    store = S3Store(seaweed.bucket, **seaweed.storage_options())  # pyright: ignore[reportArgumentType]
    prefix = url.split(f"{seaweed.bucket}/", 1)[1] + "/"
    return {meta["path"][len(prefix) :] for chunk in obstore.list(store, prefix=prefix) for meta in chunk}


def test_the_last_node_names_units_no_node_took_at_a_bucket_url(
    seaweed, tmp_path, tiny_tokenizer, jsonl_dir, make_texts, monkeypatch
):
    import obstore
    from obstore.store import S3Store

    corpus = _corpus(jsonl_dir, make_texts)
    env = {**seaweed.env, "AWS_ENDPOINT_URL": seaweed.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    key = f"nodes-{uuid.uuid4().hex[:8]}"
    target = f"s3://{seaweed.bucket}/{key}"

    def node(rank: int):
        monkeypatch.setenv("TOKENLOOM_CACHE_DIR", str(tmp_path / f"cache-{rank}"))  # a machine of its own
        config = TokenizeConfig(
            input_dir=corpus, tokenizer=str(tiny_tokenizer), num_workers=0, num_nodes=2, node_rank=rank,
            output_dir=target,  # pyright: ignore[reportArgumentType] - a URL string, as the CLI passes it
        )  # fmt: skip
        return tokenize(config)

    node(0)
    assert ".tokenloom-node-000000.finished" in _names_at(seaweed, target)
    store = S3Store(seaweed.bucket, **seaweed.storage_options())  # pyright: ignore[reportArgumentType]
    obstore.delete(store, f"{key}/.tokenloom-unit-000002.done")  # lost after node 0 finished: no node takes it
    with pytest.raises(DataError, match=r"every node of --num-nodes 2 has finished, yet 1 of 4 units were taken by no "
                       r"node at s3://.*: 2 \(part2.jsonl\)") as info:  # fmt: skip
        node(1)
    assert "Rerun --node-rank 0 of --num-nodes 2" in str(info.value)
    monkeypatch.setenv("TOKENLOOM_CACHE_DIR", str(tmp_path / "cache-new-machine"))
    node(0)  # the rerun the hint names encodes the unit again and, last, uploads the manifest
    names = _names_at(seaweed, target)
    assert "manifest.json" in names and not [n for n in names if n.endswith(".finished") or n == NODES_NAME]


def test_a_node_that_finds_another_publishing_waits_for_it(tmp_path, tiny_tokenizer, jsonl_dir, make_texts):
    """Both nodes see every node finished and both go to publish; the one without the lock waits for the other,
    then finds the output published (CI: a 2-node grpo run failed with OutputLockedError on one node)."""
    import threading
    import time

    from tokenloom.formats.io import output_lock

    corpus, out = _corpus(jsonl_dir, make_texts), tmp_path / "out"
    assert _finish(_node(corpus, out, tiny_tokenizer, 2, 1))[0] == 0  # node 1 done; node 0 will see everyone
    with output_lock(out, what="--output-dir"):  # the other node, publishing
        node = _node(corpus, out, tiny_tokenizer, 2, 0)
        threading.Event().wait(3.0)
        assert node.poll() is None, node.communicate()[0]  # still waiting for the lock, not failed
        time.sleep(0.1)
    code, output = _finish(node)
    assert code == 0, output
    assert len(open_dataset(out, validate="deep")) == 120
