"""One `tokenize --layout tree --val-fraction` run, opened unchanged by curriculum and by eval-broadcast."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

from tokenloom.curriculum import CurriculumConfig, CurriculumDataset
from tokenloom.eval_broadcast import PathEvalSource, broadcast_eval_set
from tokenloom.formats import open_dataset
from tokenloom.tokenize import build_stdlib_corpus

BUCKETS = {"text": ["textwrap", "string", "difflib"], "data": ["json", "csv"], "net": ["http", "urllib"]}


def test_a_tree_run_is_what_curriculum_and_eval_broadcast_open(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    for bucket, modules in BUCKETS.items():
        build_stdlib_corpus(raw / "train" / bucket, modules=modules, min_chars=40)
    out = tmp_path / "data"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(
        [sys.executable, "-m", "tokenloom.formats", "tokenize", "--input-dir", str(raw), "--output-dir", str(out),
         "--layout", "tree", "--val-fraction", "0.1", "--seed", "7", "--seq-len", "256", "--num-workers", "2",
         "--no-progress"],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    for bucket in BUCKETS:
        assert open_dataset(out / "val" / bucket).num_tokens > 0

    # curriculum: a GPT-Simple-style config whose path is the tree output, unchanged
    config_path = tmp_path / "curriculum.yaml"
    mix = {bucket: round(1 / len(BUCKETS), 3) for bucket in BUCKETS}
    config_path.write_text(
        yaml.safe_dump({"data": {"path": str(out), "max_length": 128, "packing": True,
                                 "curriculum": [{"duration_tokens": 2000, "mix": mix}]}})
    )  # fmt: skip
    config = CurriculumConfig.from_file(config_path)
    dataset = CurriculumDataset(config, seed=0, plan_cache_dir=tmp_path / "plans")
    assert len(dataset) > 0
    sample = dataset[0]
    assert sample["input_ids"].shape[-1] == 128
    check = subprocess.run(
        [sys.executable, "-m", "tokenloom.formats", "curriculum", "plan", str(config_path)],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr

    # eval-broadcast: a val leaf as its eval set (one process: the source rank is this one)
    evalset = broadcast_eval_set(PathEvalSource(out / "val" / "text"), seq_len=64, cache_dir=tmp_path / "evalcache")
    stream = open_dataset(out / "val" / "text")
    rows = evalset.numpy()
    flat = rows.reshape(-1)[: stream.num_tokens]
    assert np.array_equal(flat, stream.tokens(0, stream.num_tokens))
