"""Real gloo process groups for the tests: every rank a spawned process, every wait bounded."""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
TEXTS = [
    "the cat sat on the mat",
    "a dog ran",
    "the dog sat",
    "cats and dogs and mats",
    "on the mat the cat ran",
    "a cat",
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    directory = tmp_path_factory.mktemp("tok")
    model = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<eos>"])
    model.train_from_iterator(TEXTS * 20, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=model, eos_token="<eos>", unk_token="<unk>")
    fast.save_pretrained(directory)
    return directory


@pytest.fixture
def run_ranks(tmp_path):
    """``run_ranks(world, scenario, params, timeout)`` -> one result dict per rank (None: no result)."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))  # spawned children inherit sys.path and import the worker module
    workers = importlib.import_module("_eval_ranks")
    started: list[Any] = []

    def run(
        world: int, scenario: str, params: dict[str, Any] | None = None, timeout: float = 120.0, stopped: tuple = ()
    ) -> list[Any]:
        """Ranks in ``stopped`` are expected to stop themselves: not awaited, killed afterwards."""
        run_dir = tmp_path / f"{scenario}-{world}-{time.monotonic_ns()}"
        run_dir.mkdir()
        context = multiprocessing.get_context("spawn")
        processes = [
            context.Process(
                target=workers.main,
                args=(rank, world, str(run_dir / "init"), scenario, str(run_dir), json.dumps(params or {})),
                daemon=True,
            )
            for rank in range(world)
        ]
        started.extend(processes)
        for process in processes:
            process.start()
        deadline = time.monotonic() + timeout
        for rank, process in enumerate(processes):
            if rank not in stopped:
                process.join(max(0.1, deadline - time.monotonic()))
        hung = [rank for rank, p in enumerate(processes) if p.is_alive() and rank not in stopped]
        for rank in stopped:
            if processes[rank].is_alive():
                os.kill(processes[rank].pid, signal.SIGKILL)
            processes[rank].join(5)
        results = []
        for rank in range(world):
            path = run_dir / f"result-rank{rank}.json"
            results.append(json.loads(path.read_text()) if path.exists() else None)
        if hung:
            pytest.fail(f"ranks {hung} of {scenario} did not finish within {timeout} s (a hang)")
        return results

    yield run
    for process in started:
        if process.is_alive():
            os.kill(process.pid, signal.SIGKILL)
            process.join(5)


@pytest.fixture
def jsonl(tmp_path):
    path = tmp_path / "val.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    return path


@pytest.fixture
def texts():
    return list(TEXTS)
