"""A data-parallel "training" job through a curriculum, launched by torchrun (gloo).

Every rank reads CurriculumDataset through the elastic sampler (shuffle=False: the
sampler hands out global positions, the curriculum's schedule places the samples)
and a StatefulDataLoader with real workers, and appends per step the positions,
bucket ids and first tokens of its batch to ``OUT/rank<r>.jsonl`` (fsynced, so a
SIGKILL loses nothing written). At ``--checkpoint-step`` rank 0 saves the sampler
and curriculum state; ``--hang-after-checkpoint`` keeps every rank working slowly
so the test can SIGKILL the job. ``--resume`` continues from the checkpoint on
whatever world size torchrun gives. A bucket that runs dry with the halt policy
raises BucketExhausted on every rank at the same step: the job saves the state at
the halt, writes the terminal ``halted`` run status and exits 3.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import orjson
import torch
import torch.distributed as dist
from torchdata.stateful_dataloader import StatefulDataLoader

from tokenloom.curriculum import BucketExhausted, CurriculumDataset, record_halt, write_run_status
from tokenloom.datasets import SampleBatch, collate
from tokenloom.formats.io import atomic_write_bytes
from tokenloom.sampler import ResumableDistributedSampler, sampler_state_from_loader

HALT_EXIT = 3


class WithPositions(torch.utils.data.Dataset):
    def __init__(self, dataset: CurriculumDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices):
        batch = self.dataset.__getitems__(indices)
        return SampleBatch({**batch.batched, "position": torch.as_tensor(list(indices), dtype=torch.int64)})


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--checkpoint-step", type=int, default=-1)
    parser.add_argument("--hang-after-checkpoint", action="store_true")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--after-halt", action="store_true", help="the policy was changed on purpose after a halt")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / f"rank{rank}.jsonl", "ab")  # noqa: SIM115 - open for the job's life
    dataset = CurriculumDataset(args.config, seed=args.seed, global_batch_size=world * args.batch_size)
    sampler = ResumableDistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False, seed=0, pad=False)
    start_step = 0
    try:
        if args.resume:
            saved = orjson.loads(Path(args.checkpoint).read_bytes())
            dataset.load_state_dict(saved["curriculum"])  # a state at a halt halts again here, at once
            sampler.load_state_dict(saved["sampler"])
            start_step = int(saved["sampler"]["consumed"]) // (world * args.batch_size)
        dist.barrier()  # every rank has read the saved state before rank 0 may overwrite it
        if rank == 0:
            write_run_status(args.run_dir, "running", after_halt=args.after_halt, world=world)
        loader = StatefulDataLoader(
            WithPositions(dataset),
            sampler=sampler,
            batch_size=args.batch_size,
            num_workers=args.workers,
            collate_fn=collate,
            timeout=120 if args.workers else 0,
        )
        step = start_step
        for batch in loader:
            record = {
                "rank": rank,
                "world": world,
                "step": step,
                "positions": batch["position"].tolist(),
                "buckets": batch["bucket"].tolist(),
                "first": batch["input_ids"][:, :2].tolist(),
            }
            log.write(orjson.dumps(record) + b"\n")
            log.flush()
            os.fsync(log.fileno())
            step += 1
            if step == args.checkpoint_step:
                state = sampler_state_from_loader(loader.state_dict())
                if rank == 0:
                    blob = {"sampler": state, "curriculum": dataset.state_dict(consumed=state["consumed"])}
                    atomic_write_bytes(args.checkpoint, orjson.dumps(blob))
                dist.barrier()
            if args.hang_after_checkpoint and step >= args.checkpoint_step:
                time.sleep(0.5)  # keep working slowly; the test SIGKILLs the job mid-flight
    except BucketExhausted as exc:
        halt_step = exc.step if exc.step is not None else start_step
        Path(out, f"halt-rank{rank}.json").write_bytes(
            orjson.dumps({"rank": rank, "step": halt_step, "bucket": exc.bucket, "message": str(exc)})
        )
        if rank == 0:
            consumed = halt_step * world * args.batch_size
            state = sampler.state_dict()
            state = {**state, "consumed": consumed}  # the halt position: every step before it was taken
            blob = {"sampler": state, "curriculum": dataset.state_dict(consumed=consumed)}
            if not args.resume:
                atomic_write_bytes(args.checkpoint, orjson.dumps(blob))
            record_halt(args.run_dir, exc, step=halt_step)
        dist.barrier()
        dist.destroy_process_group()
        return HALT_EXIT
    log.close()
    dist.barrier()
    if rank == 0:
        write_run_status(args.run_dir, "completed", after_halt=args.after_halt, samples=len(dataset))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main())
