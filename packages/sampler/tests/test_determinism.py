"""The order depends on (seed, epoch, N) only: not on hash seeds, thread counts or the process."""

import json
import os
import subprocess
import sys

import numpy as np

from tokenloom.sampler import ResumableDistributedSampler

CASES = [(1000, 0, 0), (12345, 7, 3), (10**10, 2**63 + 1, 11)]

PROGRAM = """
import json, sys
import numpy as np, torch
torch.set_num_threads(1)
from tokenloom.sampler import ResumableDistributedSampler
out = []
for n, seed, epoch in json.loads(sys.argv[1]):
    sampler = ResumableDistributedSampler(n, 3, 1, seed=seed, start_epoch=epoch)
    chunk = next(sampler.iter_chunks(500))
    out.append(chunk.tolist())
print(json.dumps(out))
"""


def in_this_process() -> list[list[int]]:
    out = []
    for n, seed, epoch in CASES:
        sampler = ResumableDistributedSampler(n, 3, 1, seed=seed, start_epoch=epoch)
        out.append(next(sampler.iter_chunks(500)).tolist())
    return out


def test_another_process_with_another_hash_seed_and_thread_count_gives_the_same_order() -> None:
    env = {**os.environ, "PYTHONHASHSEED": "12345", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM, json.dumps(CASES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(result.stdout) == in_this_process()


def test_chunk_size_does_not_change_the_order() -> None:
    sampler = ResumableDistributedSampler(5000, 3, 2, seed=4)
    by_sample = list(sampler)
    for size in (1, 7, 4096):
        sampler.set_epoch(0)
        assert np.concatenate(list(sampler.iter_chunks(size))).tolist() == by_sample
