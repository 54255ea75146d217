"""One rank of the gloo tests (a module, so torch.multiprocessing.spawn can import it)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from tokenloom.sampler import ResumableDistributedSampler


def run_rank(rank: int, world: int, workdir: str, n: int, steps: int, state_file: str | None) -> None:
    """Take ``steps`` lock-step samples (-1: to the end), check agreement, write what this rank saw."""
    store = f"file://{workdir}/store"
    timeout = timedelta(seconds=60)
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world, timeout=timeout)
    try:
        sampler = ResumableDistributedSampler(n, seed=21)  # world and rank from torch.distributed
        if state_file is not None:
            sampler.load_state_dict(json.loads(Path(state_file).read_text()))
        iterator = iter(sampler)
        total = len(sampler) if steps < 0 else steps
        indices = [next(iterator) for _ in range(total)]
        count = torch.tensor([len(indices)])
        dist.all_reduce(count)  # lock-step: every rank took the same number of samples
        state = sampler.state_dict()
        states: list[object] = [None] * world
        dist.all_gather_object(states, state)
        if count.item() != total * world or any(other != state for other in states):
            raise RuntimeError(f"ranks disagree: count {count.item()}, states {states}")
        out = {"rank": sampler.rank, "world": sampler.num_replicas, "indices": indices, "state": state}
        Path(workdir, f"rank{rank}.json").write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()
