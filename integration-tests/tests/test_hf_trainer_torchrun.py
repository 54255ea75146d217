"""Hugging Face Trainer with tokenloom's sampler: killed after a checkpoint on 2 processes, resumed on 1 and on 3.

A tiny Llama (local config, random weights) trains under torchrun (gloo, CPU) on a packed native dataset.
The oracle is what each rank trained on at each step (hashes of the ``input_ids`` rows, mapped back to
dataset indices): the killed run's steps up to its checkpoint plus a resumed run's steps cover every sample
of the epoch exactly once, in the uninterrupted order (the sampler's order, computed here: positions
``c + r, c + r + W, ...``), whatever the number of processes of the resumed run. Trainer's own batch skipping
would skip the checkpoint's batches a second time; a re-iterating loader would repeat them.

The runs go through torchrun's own launcher (``elastic_launch``: the elastic agent, a c10d rendezvous, the
same per-rank environment) with the ranks forked from this process, which imported transformers once: a
torchrun per run re-imported torch and transformers in every rank and its launcher (9 interpreters, 160-220 s
on the loaded machine). ``jobs/trainer_job.py`` still runs under the torchrun command line as it is.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import signal
import threading
import uuid
from pathlib import Path

import numpy as np
import orjson
import pytest
from torchrun_helpers import JOB_TIMEOUT, JOBS

from tokenloom.datasets import MemoryMappedDataset
from tokenloom.formats import open_writer
from tokenloom.sampler import ResumableDistributedSampler

SEQ_LEN, BATCH, NUM_SAMPLES, SEED = 32, 2, 48, 1234
CHECKPOINT_STEP, KILL_STEP = 6, 8  # 2 processes x 2 samples x 6 steps = 24 samples before the checkpoint


def load_job():
    spec = importlib.util.spec_from_file_location("trainer_job", JOBS / "trainer_job.py")
    assert spec is not None and spec.loader is not None
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)  # imports torch and transformers here, once, before the ranks fork
    return job


def descendants(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
        except (OSError, IndexError):
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def launch(entrypoint, nproc: int, *argv: str) -> bool:
    """``torchrun --standalone --nproc-per-node=nproc`` of ``entrypoint(argv)``, ranks forked; False if a rank failed.

    A run that outlives JOB_TIMEOUT has its processes killed and fails the test (a hang fails).
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # as --standalone
        max_restarts=0,
        monitor_interval=0.1,
        start_method="fork",
    )
    hung = threading.Event()

    def kill_all() -> None:
        hung.set()
        for pid in descendants(os.getpid()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}  # the agent sets its own
    watchdog = threading.Timer(JOB_TIMEOUT, kill_all)
    watchdog.start()
    try:
        elastic_launch(config, entrypoint)(list(argv))
        return True
    except ChildFailedError:
        return False
    finally:
        watchdog.cancel()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if hung.is_set():
            pytest.fail(f"the {nproc}-process run hung for {JOB_TIMEOUT} s")


def write_tokens(root: Path) -> MemoryMappedDataset:
    """Exactly NUM_SAMPLES windows of SEQ_LEN + 1 tokens, documents ending in EOS 0."""
    rng = np.random.default_rng(5)
    remaining = NUM_SAMPLES * (SEQ_LEN + 1)
    with open_writer(root, dtype="uint16", vocab_size=256, eos_id=0) as writer:
        while remaining:
            length = min(remaining, int(rng.integers(5, 60)))
            writer.add(np.append(rng.integers(1, 256, size=length - 1), 0))
            remaining -= length
    dataset = MemoryMappedDataset(root, seq_len=SEQ_LEN, pack_sequences=True, position_ids=True)
    assert len(dataset) == NUM_SAMPLES
    return dataset


def row_hash(row: np.ndarray) -> str:
    return hashlib.blake2b(row.astype("int64").tobytes(), digest_size=8).hexdigest()


def trained(out: Path, index_of: dict[str, int], *, up_to: int | None = None) -> dict[tuple[int, int], list[int]]:
    """{(step, rank): dataset indices trained on}, from the job's per-rank records."""
    steps: dict[tuple[int, int], list[int]] = {}
    for path in sorted(out.glob("rank*.jsonl")):
        for line in path.read_bytes().splitlines():
            record = orjson.loads(line)
            if up_to is None or record["step"] <= up_to:
                steps.setdefault((record["step"], record["rank"]), []).extend(index_of[h] for h in record["rows"])
    return steps


def expected(order: np.ndarray, consumed: int, world: int, first_step: int, steps: int) -> dict[tuple[int, int], list]:
    """The uninterrupted order from global position ``consumed`` on ``world`` processes."""
    return {
        (first_step + step, rank): [int(order[consumed + (step * BATCH + i) * world + rank]) for i in range(BATCH)]
        for step in range(steps)
        for rank in range(world)
    }


def test_trainer_resumes_exactly_on_one_and_three_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dataset = write_tokens(tmp_path / "tokens")
    index_of = {row_hash(dataset[i]["input_ids"].numpy()): i for i in range(len(dataset))}
    assert len(index_of) == NUM_SAMPLES  # random tokens: every window is told apart by its hash
    order = ResumableDistributedSampler(NUM_SAMPLES, 1, 0, seed=SEED).indices_at(np.arange(NUM_SAMPLES))
    for name, value in {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
        monkeypatch.setenv(name, value)
    job = load_job()
    common = ["--data", str(tmp_path / "tokens"), "--seq-len", str(SEQ_LEN), "--batch-size", str(BATCH)]

    # killed: 2 processes with a DataLoader worker each (read-ahead), checkpoint at step 6, SIGKILL at step 8
    killed = tmp_path / "killed"
    arguments = ["--out", str(killed), "--max-steps", "12", "--save-steps", str(CHECKPOINT_STEP), "--workers", "1"]
    assert not launch(job.main, 2, *common, *arguments, "--kill-at-step", str(KILL_STEP))  # rank 0 killed
    checkpoint = killed / "checkpoints" / f"checkpoint-{CHECKPOINT_STEP}"
    assert (checkpoint / "trainer_state.json").is_file()
    saved = orjson.loads((checkpoint / "trainer_state.json").read_bytes())["stateful_callbacks"]["tokenloom_sampler"]
    assert (saved["epoch"], saved["consumed"]) == (0, 24)
    before = trained(killed, index_of, up_to=CHECKPOINT_STEP)
    assert before == expected(order, 0, 2, 1, CHECKPOINT_STEP)  # the uninterrupted run's first 6 steps
    assert max(step for step, _ in trained(killed, index_of)) > CHECKPOINT_STEP  # it did work past the checkpoint

    for world in (1, 3):
        resumed = tmp_path / f"resumed{world}"
        start = tmp_path / f"from{world}"
        shutil.copytree(checkpoint, start)
        remaining_steps = (NUM_SAMPLES - 24) // (world * BATCH)
        steps = str(CHECKPOINT_STEP + remaining_steps)
        assert launch(job.main, world, *common, "--out", str(resumed), "--max-steps", steps, "--resume", str(start))
        after = trained(resumed, index_of)
        assert after == expected(order, 24, world, CHECKPOINT_STEP + 1, remaining_steps)
        consumed = sorted(i for rows in [*before.values(), *after.values()] for i in rows)
        assert consumed == list(range(NUM_SAMPLES)), f"resumed on {world}: not every sample exactly once"
