"""Unit-planned runs: the same bytes for 1 process, 2 workers and 3 nodes; a killed node costs only its units."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tokenize_helpers import assert_a_changed_input_is_named, numbered_parts

from tokenloom.formats import ConfigError, DataError, ResumeMismatchError, open_dataset
from tokenloom.formats.io import WRITING_MARKER
from tokenloom.tokenize import TokenizeConfig, tokenize
from tokenloom.tokenize._config import nodes_from_env
from tokenloom.tokenize._unit_files import done_path

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses SIGKILL")

OPTIONS = {"shard_size_tokens": 3000, "seq_len": 64, "overlap_size": 8}
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture
def corpus(jsonl_dir: Callable[..., Path], make_texts: Callable[..., list[str]]) -> Path:
    return jsonl_dir({**numbered_parts(make_texts, 7, 3, 150, 40), "sub/empty-ish.jsonl": [{"text": ""}]})


def _config(corpus: Path, out: Path, tokenizer: Path, **extra: object) -> TokenizeConfig:
    return TokenizeConfig(input_dir=corpus, output_dir=out, tokenizer=str(tokenizer), **{**OPTIONS, **extra})  # type: ignore[arg-type]


def _one_node_reference(corpus: Path, tmp_path: Path, tokenizer: Path) -> Path:
    """tmp_path/reference: the corpus tokenized by one node in-process."""
    tokenize(_config(corpus, tmp_path / "reference", tokenizer, num_nodes=1, num_workers=0))
    return tmp_path / "reference"


def _node_args(corpus: Path, out: Path, tokenizer: Path, nodes: int, rank: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tokenloom.formats",
        "tokenize",
        "--input-dir",
        str(corpus),
        "--output-dir",
        str(out),
        "--tokenizer",
        str(tokenizer),
        "--num-nodes",
        str(nodes),
        "--node-rank",
        str(rank),
        "--num-workers",
        "0",
        "--no-progress",
        *(f"--{k.replace('_', '-')}={v}" for k, v in OPTIONS.items()),
        *extra,
    ]


def _run_nodes(corpus: Path, out: Path, tokenizer: Path, nodes: int) -> None:
    """``nodes`` real processes side by side, as a Slurm array would start them."""
    procs = [
        subprocess.Popen(_node_args(corpus, out, tokenizer, nodes, r), env=ENV, stderr=subprocess.PIPE)
        for r in range(nodes)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err.decode()[-3000:]


def test_same_bytes_for_one_process_two_workers_three_nodes(
    corpus: Path, tmp_path: Path, tiny_tokenizer: Path, tree_digest: Callable[[Path], dict[str, str]]
) -> None:
    one = tmp_path / "one"
    summary = tokenize(_config(corpus, one, tiny_tokenizer, num_nodes=1, num_workers=0))
    assert summary.units_total == 0 and summary.shards >= 8  # finalized; at least one shard per unit
    two = tmp_path / "two"
    tokenize(_config(corpus, two, tiny_tokenizer, num_nodes=1, num_workers=2))
    three = tmp_path / "three"
    _run_nodes(corpus, three, tiny_tokenizer, 3)
    reference = tree_digest(one)
    assert tree_digest(two) == reference
    assert tree_digest(three) == reference
    # a single process (no --num-nodes) is the same pipeline: the same bytes as 2 and 3 nodes
    single = tmp_path / "single"
    tokenize(_config(corpus, single, tiny_tokenizer, num_workers=0))
    assert tree_digest(single) == reference
    pair = tmp_path / "pair"
    _run_nodes(corpus, pair, tiny_tokenizer, 2)
    assert tree_digest(pair) == reference


def test_sigkill_of_one_node_then_rerun_of_that_node_only(
    corpus: Path, tmp_path: Path, tiny_tokenizer: Path, tree_digest: Callable[[Path], dict[str, str]]
) -> None:
    reference = _one_node_reference(corpus, tmp_path, tiny_tokenizer)
    out = tmp_path / "out"
    for rank in (0, 2):  # nodes 0 and 2 finish; node 1 (units 1, 4, 7) is killed after its first commit
        subprocess.run(_node_args(corpus, out, tiny_tokenizer, 3, rank), env=ENV, check=True, capture_output=True)
    assert not (out / "manifest.json").exists()
    proc = subprocess.Popen(_node_args(corpus, out, tiny_tokenizer, 3, 1), env=ENV, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not done_path(out, 1).exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    first_commit = done_path(out, 1).stat()
    assert not (out / "manifest.json").exists()
    assert (out / WRITING_MARKER).exists()  # readers refuse the unfinished directory
    with pytest.raises(DataError):
        open_dataset(out)
    rerun = subprocess.run(_node_args(corpus, out, tiny_tokenizer, 3, 1), env=ENV, capture_output=True, check=True)
    assert b"wrote" in rerun.stdout
    assert done_path(out, 1).stat().st_ino == first_commit.st_ino  # the committed unit was not redone
    assert tree_digest(out) == tree_digest(reference)


def test_finalize_writes_the_manifest_once_every_unit_is_committed(
    corpus: Path, tmp_path: Path, tiny_tokenizer: Path, tree_digest: Callable[[Path], dict[str, str]]
) -> None:
    out = tmp_path / "out"
    partial = tokenize(_config(corpus, out, tiny_tokenizer, num_nodes=2, node_rank=0, num_workers=0))
    assert partial.units_total == 8 and partial.units_missing == 4 and partial.units_committed == 4
    with pytest.raises(DataError, match=r"4 of 8 units are not committed yet: 1 \(part-1.jsonl\)"):
        tokenize(_config(corpus, out, tiny_tokenizer, num_nodes=2, finalize=True))
    finished = tokenize(_config(corpus, out, tiny_tokenizer, num_nodes=2, node_rank=1, num_workers=0))
    assert finished.units_total == 0 and finished.tokens > 0
    reference = tree_digest(out)
    # the last node died between its last commit and the manifest: --finalize writes the same one
    (out / "manifest.json").unlink()
    (out / WRITING_MARKER).touch()
    done = tokenize(_config(corpus, out, tiny_tokenizer, finalize=True))
    assert done.tokens == finished.tokens
    assert tree_digest(out) == reference
    again = tokenize(_config(corpus, out, tiny_tokenizer, num_nodes=3, node_rank=2))
    assert again.already_complete


def test_an_input_changed_since_the_plan_is_a_resume_mismatch_naming_it(
    corpus: Path, tmp_path: Path, tiny_tokenizer: Path
) -> None:
    two_nodes = functools.partial(_config, corpus, tmp_path / "out", tiny_tokenizer, num_nodes=2, num_workers=0)
    more = (corpus / "part-5.jsonl").read_bytes() + b'{"text": "one more"}\n'
    assert_a_changed_input_is_named(two_nodes, tmp_path / "out", corpus / "part-5.jsonl", more)


def test_two_runs_with_other_settings_into_one_output_are_refused(
    corpus: Path, tmp_path: Path, tiny_tokenizer: Path
) -> None:
    out = tmp_path / "out"
    tokenize(_config(corpus, out, tiny_tokenizer, num_nodes=2, node_rank=0, num_workers=0))
    with pytest.raises(ResumeMismatchError, match=r"max_length 64 -> 32"):
        tokenize(_config(corpus, out, tiny_tokenizer, num_nodes=2, node_rank=1, num_workers=0, seq_len=32))
    # a single process is node 0 of 1 of the same plan: its complete output is complete for two nodes too
    plain = tmp_path / "plain"
    tokenize(_config(corpus, plain, tiny_tokenizer, num_workers=0))
    assert tokenize(_config(corpus, plain, tiny_tokenizer, num_nodes=2, num_workers=0)).already_complete
    with pytest.raises((ResumeMismatchError, ConfigError)):  # a single process joining a 2-node run: refused
        tokenize(_config(corpus, out, tiny_tokenizer, num_workers=0))


@pytest.mark.parametrize(("num_nodes", "node_rank"), [(3, 3), (3, -1), (1, 1)])
def test_node_rank_outside_the_nodes_is_a_config_error(tmp_path: Path, num_nodes: int, node_rank: int) -> None:
    with pytest.raises(ConfigError, match=rf"node_rank is {node_rank}, outside \[0, {num_nodes}\)"):
        TokenizeConfig(input_dir=tmp_path, output_dir=tmp_path / "o", num_nodes=num_nodes, node_rank=node_rank)
    with pytest.raises(ConfigError, match="num_nodes is 0"):
        TokenizeConfig(input_dir=tmp_path, output_dir=tmp_path / "o", num_nodes=0)


def test_node_rank_outside_the_nodes_on_the_command_line(corpus: Path, tmp_path: Path, tiny_tokenizer: Path) -> None:
    out = tmp_path / "out"
    result = subprocess.run(_node_args(corpus, out, tiny_tokenizer, 3, 3), env=ENV, capture_output=True)
    assert result.returncode != 0
    assert b"node_rank is 3, outside [0, 3)" in result.stderr
    assert b"Traceback" not in result.stderr
    assert not out.exists()


def test_nodes_default_to_the_slurm_variables(corpus: Path, tmp_path: Path, tiny_tokenizer: Path) -> None:
    assert nodes_from_env({"SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_ID": "2"}) == (4, 2)
    assert nodes_from_env({"SLURM_NTASKS": "8", "SLURM_PROCID": "5"}) == (8, 5)
    assert nodes_from_env({}) is None
    with pytest.raises(ConfigError, match="SLURM_ARRAY_TASK_COUNT"):
        nodes_from_env({"SLURM_ARRAY_TASK_COUNT": "x", "SLURM_ARRAY_TASK_ID": "0"})
    out = tmp_path / "out"
    args = [a for a in _node_args(corpus, out, tiny_tokenizer, 1, 0) if a not in ("--num-nodes", "--node-rank")]
    args.remove("1")
    args.remove("0")  # --num-nodes 1 --node-rank 0 removed: the array variables decide
    env = {**ENV, "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_ID": "1"}
    result = subprocess.run(args, env=env, capture_output=True, check=True)
    assert b"committed 4 unit(s)" in result.stdout
    assert done_path(out, 1).exists() and not done_path(out, 0).exists()


def test_overwrite_on_one_node_replaces_a_single_process_output(
    corpus: Path, tmp_path: Path, tiny_tokenizer: Path, tree_digest: Callable[[Path], dict[str, str]]
) -> None:
    reference = _one_node_reference(corpus, tmp_path, tiny_tokenizer)
    out = tmp_path / "out"
    tokenize(_config(corpus, out, tiny_tokenizer, num_workers=0))  # the single-process layout
    tokenize(_config(corpus, out, tiny_tokenizer, num_nodes=1, num_workers=0, overwrite=True))
    assert tree_digest(out) == tree_digest(reference)
    with pytest.raises(ConfigError, match="overwrite with num_nodes > 1"):
        _config(corpus, out, tiny_tokenizer, num_nodes=2, overwrite=True)
