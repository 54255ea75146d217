"""One rank of the curriculum gloo test (a module, so torch.multiprocessing.spawn can import it)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from tokenloom.curriculum import BucketExhausted, CurriculumConfig, CurriculumDataset, record_halt, write_run_status
from tokenloom.datasets import collate
from tokenloom.sampler import ResumableDistributedSampler


def run_rank(rank: int, world: int, workdir: str, config_file: str, batch: int) -> None:
    """Train-like loop: one all_reduce per step (a rank that stopped early would hang the others)."""
    dist.init_process_group(
        "gloo", init_method=f"file://{workdir}/store", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    out: dict[str, object] = {"rank": rank}
    try:
        ds = CurriculumDataset(CurriculumConfig.from_file(config_file), seed=99, global_batch_size=batch * world)
        sampler = ResumableDistributedSampler(ds, shuffle=False, seed=99)
        loader = DataLoader(ds, sampler=sampler, batch_size=batch, collate_fn=collate)
        run_dir = Path(workdir) / "run"
        if rank == 0:
            write_run_status(run_dir, "running", step=0)
        completed = 0
        try:
            for tensors in loader:
                tokens = torch.tensor([int((tensors["labels"] != -100).sum())])
                dist.all_reduce(tokens)
                completed += 1
            out["finished"] = True
        except BucketExhausted as exc:
            out.update(bucket=exc.bucket, error_step=exc.step, planned_step=ds.halt_step())
            if rank == 0:
                record_halt(run_dir, exc, step=completed)
                write_run_status(run_dir, "stopped", step=completed)  # must not downgrade the halt
        out["completed_steps"] = completed
    finally:
        Path(workdir, f"rank{rank}.json").write_text(json.dumps(out))
        dist.destroy_process_group()
