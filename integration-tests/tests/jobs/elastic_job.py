"""One data-parallel "training" job over real ranks, launched by torchrun.

Every rank iterates a StatefulDataLoader (real worker processes) over the
packed-window dataset with the elastic sampler and appends, per step, the
sample ids of its batch to ``OUT/rank<r>.jsonl`` (flushed and fsynced, so a
SIGKILL loses nothing written). At ``--checkpoint-step`` rank 0 saves the data
state (crash-safely); with ``--hang-after-checkpoint`` every rank then keeps
going slowly so the test can kill the job mid-flight. ``--resume`` loads the
saved state (on whatever world size torchrun gave) and runs to the epoch's end.
``--data`` may be a URL (``s3://...``): credentials, endpoint and the node's cache directory then come
from the environment (AWS_*, TOKENLOOM_CACHE_DIR). ``--order block`` uses the sampler's block order.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import orjson
import torch
import torch.distributed as dist
from torchdata.stateful_dataloader import StatefulDataLoader

from tokenloom.formats.io import atomic_write_bytes
from tokenloom.sampler import ResumableDistributedSampler, sampler_state_from_loader

SEED = 1234


class WithSampleIds(torch.utils.data.Dataset):
    """Adds each sample's index, so the test can account for every sample."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {**self.dataset[index], "sample_id": torch.tensor(index)}


def build_dataset(data: str, seq_len: int) -> WithSampleIds:
    from tokenloom.datasets import MemoryMappedDataset

    return WithSampleIds(MemoryMappedDataset(data, seq_len, pack_sequences=True))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--checkpoint-step", type=int, default=-1)
    parser.add_argument("--hang-after-checkpoint", action="store_true")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--order", default="feistel")
    parser.add_argument("--block-samples", type=int, default=None)
    parser.add_argument("--window-blocks", type=int, default=None)
    parser.add_argument("--late-resume", type=float, default=0.0, help="ranks > 0 read the state this late (s)")
    args = parser.parse_args()
    block = {"block_samples": args.block_samples, "window_blocks": args.window_blocks} if args.order == "block" else {}

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = build_dataset(args.data, args.seq_len)
    sampler = ResumableDistributedSampler(
        dataset, num_replicas=world, rank=rank, seed=SEED, pad=False, order=args.order, **block
    )
    if args.resume:
        time.sleep(args.late_resume if rank else 0.0)  # a slow rank: rank 0 must not overwrite the file before
        sampler.load_state_dict(orjson.loads(Path(args.checkpoint).read_bytes()))
    # Every rank has read the saved state before any rank may overwrite it: without this barrier rank 0 could
    # save its first checkpoint into the same file before a slower rank has read the old one (seen in CI:
    # rank 1 resumed from rank 0's new state, 8 samples late). A real training step's all-reduce does the same.
    dist.barrier()
    loader = StatefulDataLoader(
        dataset,
        sampler=sampler,
        batch_size=args.batch_size,
        num_workers=args.workers,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / f"rank{rank}.jsonl", "ab")  # noqa: SIM115 - open for the job's life
    for step, batch in enumerate(loader):
        ids = batch["sample_id"].tolist()
        checksum = int(batch["input_ids"].sum())
        log.write(orjson.dumps({"rank": rank, "world": world, "step": step, "ids": ids, "sum": checksum}) + b"\n")
        log.flush()
        os.fsync(log.fileno())
        if step + 1 == args.checkpoint_step:
            state = sampler_state_from_loader(loader.state_dict())
            if rank == 0:
                atomic_write_bytes(args.checkpoint, orjson.dumps(state))
            dist.barrier()
        if args.hang_after_checkpoint and step + 1 >= args.checkpoint_step:
            time.sleep(0.5)  # keep working slowly; the test SIGKILLs the job mid-flight
    log.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
