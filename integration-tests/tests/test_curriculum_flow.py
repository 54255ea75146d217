"""Curriculum over buckets tokenized by the real pipeline: plan, plot, packed samples, resume on other workers.

Three buckets of stdlib docstrings are tokenized with the shipped BPE into GPT-Simple's
layout (train/<bucket>, val/<bucket>) by one `tokenize --layout tree` run, a GPT-Simple-style
YAML drives the curriculum, `tokenloom curriculum plan` draws the plot, and a StatefulDataLoader
run interrupted on 2 workers and finished on 3 consumes every scheduled sample exactly once, in order.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import torch
import yaml
from torchdata.stateful_dataloader import StatefulDataLoader

from tokenloom.curriculum import CurriculumConfig, CurriculumDataset
from tokenloom.datasets import collate
from tokenloom.sampler import ResumableDistributedSampler, sampler_state_from_loader
from tokenloom.tokenize import build_stdlib_corpus

TIMEOUT = 300
BUCKETS = {
    "text": (["textwrap", "string", "difflib"], ["shlex", "fnmatch"]),
    "data": (["json", "csv", "pickle"], ["plistlib"]),
    "net": (["http", "urllib", "email"], ["ftplib"]),
}


def tokenloom(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(
        [sys.executable, "-m", "tokenloom.formats", *args],
        capture_output=True, text=True, timeout=TIMEOUT, env=env, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("curriculum")
    for bucket, (train_modules, val_modules) in BUCKETS.items():
        for split, modules in (("train", train_modules), ("val", val_modules)):
            build_stdlib_corpus(root / "corpus" / split / bucket, modules=modules, min_chars=40)
    # one run writes every <split>/<bucket> leaf (one interpreter and tokenizer load, not six)
    result = tokenloom(
        "tokenize", "--input-dir", str(root / "corpus"), "--output-dir", str(root / "data"), "--layout", "tree",
        "--seq-len", "256", "--overlap-size", "32", "--num-workers", "0", "--no-progress",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    ds = CurriculumDataset(CurriculumConfig(path=root / "data", seq_len=128, packing=True), seed=0,
                           plan_cache_dir=root / "plans")  # fmt: skip
    smallest = min(ds.schedule.bucket_tokens)
    phase_tokens = int(0.9 * smallest / 0.7)  # no bucket is asked for more than 0.7 of two phases
    config = {
        "data": {
            "path": "data",
            "tokenizer": "shipped-stdlib-bpe",
            "format": "pretokenized",
            "max_length": 128,
            "packing": True,
            "curriculum": [
                {"duration_tokens": phase_tokens, "mix": {"text": 0.5, "data": 0.3, "net": 0.2}},
                {"duration_tokens": phase_tokens, "mix": {"text": 0.2, "data": 0.4, "net": 0.5}},
            ],
        },
        "training": {"max_steps": 100},
    }
    path = root / "curriculum.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_plan_table_json_and_plot(config_file: Path) -> None:
    result = tokenloom("curriculum", "plan", str(config_file), "--json", "--plot", str(config_file.parent / "p.png"))
    assert result.returncode == 0, result.stdout + result.stderr
    payload = orjson.loads(result.stdout)
    assert [b["name"] for b in payload["plan"]["buckets"]] == ["data", "net", "text"]
    assert len(payload["plan"]["phases"]) == 2 and payload["plan"]["drains"] == []
    assert (config_file.parent / "p.png").read_bytes()[:4] == b"\x89PNG"
    assert tokenloom("validate", "--curriculum", str(config_file)).returncode == 0


def _loader(ds: CurriculumDataset, workers: int, state: dict | None) -> StatefulDataLoader:
    sampler = ResumableDistributedSampler(ds, num_replicas=1, rank=0, shuffle=False, seed=3)
    if state is not None:
        sampler.load_state_dict(state)
    timeout = 120 if workers else 0
    return StatefulDataLoader(
        ds, sampler=sampler, batch_size=4, num_workers=workers, collate_fn=collate, timeout=timeout
    )


def test_packed_curriculum_resumes_on_another_worker_count(config_file: Path) -> None:
    ds = CurriculumDataset(CurriculumConfig.from_file(config_file), seed=3, plan_cache_dir=config_file.parent / "plans")
    full = [batch for batch in _loader(ds, 0, None)]
    assert {"input_ids", "labels", "doc_ids", "position_ids", "bucket"} <= set(full[0])
    loader = _loader(ds, 2, None)
    iterator = iter(loader)
    head = [next(iterator) for _ in range(len(full) // 3)]
    state = sampler_state_from_loader(loader.state_dict())
    del iterator, loader
    tail = list(_loader(ds, 3, state))
    assert len(head) + len(tail) == len(full)
    for got, want in zip(head + tail, full, strict=True):
        assert torch.equal(got["input_ids"], want["input_ids"]) and torch.equal(got["bucket"], want["bucket"])
    # the budget unit: non-padding tokens of what was emitted, as the plan counted them
    emitted = int(ds.budget_tokens(range(len(ds))).sum())
    assert abs(emitted - ds.schedule.total_tokens) <= 0.02 * ds.schedule.total_tokens
