"""Sub-file units: one big .jsonl cut into line-aligned byte ranges, a parquet file into row-group runs.

The same bytes for 1 process, 2 workers and 3 nodes; the tokens those of a single-process run;
a changed input is a ResumeMismatchError naming it; compressed files stay whole-file units.
"""

from __future__ import annotations

import functools
import gzip
import itertools
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import pytest
from tokenize_helpers import assert_a_changed_input_is_named

from tokenloom.formats import RecordError, ResumeMismatchError, open_dataset
from tokenloom.tokenize import TokenizeConfig, tokenize
from tokenloom.tokenize._unit_files import PLAN_NAME
from tokenloom.tokenize.inputs import ByteRange, RowGroups, cut_units, discover_inputs

OPTIONS = {"shard_size_tokens": 3000, "seq_len": 64, "overlap_size": 8, "unit_bytes": 6000}
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _lines(texts: list[str]) -> bytes:
    return b"".join(orjson.dumps({"text": t}) + b"\n" for t in texts)


@pytest.fixture
def big_corpus(tmp_path: Path, make_texts: Callable[..., list[str]]) -> Path:
    """One big .jsonl (several units), a parquet file of 6 row groups, a .jsonl.gz bigger than a unit."""
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    root = tmp_path / "in"
    root.mkdir()
    (root / "big.jsonl").write_bytes(_lines(make_texts(900, seed=1)))
    table = pa.table({"text": make_texts(600, seed=2)})
    pq.write_table(table, root / "rows.parquet", row_group_size=100, compression="none")
    (root / "small.jsonl.gz").write_bytes(gzip.compress(_lines(make_texts(400, seed=3)), mtime=0))
    return root


def _config(corpus: Path, out: Path, tokenizer: Path, **extra: object) -> TokenizeConfig:
    return TokenizeConfig(input_dir=corpus, output_dir=out, tokenizer=str(tokenizer), **{**OPTIONS, **extra})  # type: ignore[arg-type]


def _node(corpus: Path, out: Path, tokenizer: Path, nodes: int, rank: int) -> list[str]:
    options = [f"--{k.replace('_', '-')}={v}" for k, v in OPTIONS.items()]
    return [
        sys.executable,
        "-m",
        "tokenloom.formats",
        "tokenize",
        f"--input-dir={corpus}",
        f"--output-dir={out}",
        f"--tokenizer={tokenizer}",
        f"--num-nodes={nodes}",
        f"--node-rank={rank}",
        "--num-workers=0",
        "--no-progress",
        *options,
    ]


def test_big_files_are_cut_into_line_aligned_ranges_and_row_group_runs(big_corpus: Path) -> None:
    files = discover_inputs(big_corpus)
    units = cut_units(files, 6000)
    by_file: dict[str, list[object]] = {}
    for unit in units:
        by_file.setdefault(unit.file.relative, []).append(unit.part)
    ranges = by_file["big.jsonl"]
    assert len(ranges) >= 4 and all(isinstance(r, ByteRange) for r in ranges)
    data = (big_corpus / "big.jsonl").read_bytes()
    assert ranges[0].start == 0 and ranges[-1].stop == len(data)  # type: ignore[union-attr]
    for before, after in itertools.pairwise(ranges):
        assert before.stop == after.start  # type: ignore[union-attr]
        assert data[after.start - 1 : after.start] == b"\n"  # type: ignore[union-attr]
    runs = by_file["rows.parquet"]
    assert len(runs) >= 2 and all(isinstance(r, RowGroups) for r in runs)
    assert runs[0].start == 0 and runs[-1].stop == 6  # type: ignore[union-attr]
    assert by_file["small.jsonl.gz"] == [None]  # compressed: one whole-file unit, whatever its size
    assert [u.part for u in cut_units(files, None)] == [None, None, None]


def test_same_bytes_for_one_process_two_workers_three_nodes_with_sub_file_units(
    big_corpus: Path, tmp_path: Path, tiny_tokenizer: Path, tree_digest: Callable[[Path], dict[str, str]]
) -> None:
    one = tmp_path / "one"
    tokenize(_config(big_corpus, one, tiny_tokenizer, num_nodes=1, num_workers=0))
    plan = orjson.loads((one / PLAN_NAME).read_bytes())
    assert len(plan["units"]) >= 7 and any("bytes" in u for u in plan["units"])
    two = tmp_path / "two"
    tokenize(_config(big_corpus, two, tiny_tokenizer, num_nodes=1, num_workers=2))
    three = tmp_path / "three"
    procs = [
        subprocess.Popen(_node(big_corpus, three, tiny_tokenizer, 3, r), env=ENV, stderr=subprocess.PIPE)
        for r in range(3)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err.decode()[-3000:]
    reference = tree_digest(one)
    assert tree_digest(two) == reference
    assert tree_digest(three) == reference
    # the entries are those of a single-process run over the whole files
    single = tmp_path / "single"
    tokenize(_config(big_corpus, single, tiny_tokenizer, num_workers=0))
    units, plain = open_dataset(three), open_dataset(single)
    assert len(units) == len(plain)
    assert np.array_equal(units.tokens(0, units.num_tokens), plain.tokens(0, plain.num_tokens))
    assert list(units.overlap_prefix) == list(plain.overlap_prefix)


def test_an_input_changed_since_the_plan_is_a_resume_mismatch_with_sub_file_units(
    big_corpus: Path, tmp_path: Path, tiny_tokenizer: Path
) -> None:
    out = tmp_path / "out"
    two_nodes = functools.partial(_config, big_corpus, out, tiny_tokenizer, num_nodes=2, num_workers=0)
    changed = big_corpus / "big.jsonl"
    data = changed.read_bytes()
    assert_a_changed_input_is_named(two_nodes, out, changed, data[:100] + b'{"text": "an edit"}\n' + data[100:])
    # another unit size is another plan
    changed.write_bytes(data)
    with pytest.raises(ResumeMismatchError, match=r"unit_bytes|changed"):
        tokenize(_config(big_corpus, out, tiny_tokenizer, num_nodes=2, node_rank=1, num_workers=0, unit_bytes=9000))


def test_a_bad_record_in_a_later_range_names_its_line_in_the_file(
    tmp_path: Path, tiny_tokenizer: Path, make_texts: Callable[..., list[str]]
) -> None:
    root = tmp_path / "in"
    root.mkdir()
    good = _lines(make_texts(500, seed=4)).splitlines(keepends=True)
    good.insert(400, b'{"text": broken\n')
    (root / "big.jsonl").write_bytes(b"".join(good))
    with pytest.raises(RecordError, match="not valid JSON") as caught:
        tokenize(_config(root, tmp_path / "out", tiny_tokenizer, num_nodes=1, num_workers=0))
    assert caught.value.record == 401
    assert str(caught.value.path).endswith("big.jsonl")
