"""The chaos job: a native dataset and a packed SFT record store read from object storage, ranks under torchrun.

One map-style dataset puts the two side by side (native windows first, then packed SFT sequences); the elastic
sampler shuffles it across ranks and a StatefulDataLoader with real workers reads it. Every rank appends per
step the identity of each sample (dataset, index; the store records packed into an SFT sample) and a digest of
its bytes to ``OUT/rank<r>.jsonl`` (fsynced: a SIGKILL loses nothing written) and its pid to ``OUT/rank<r>.pid``.
At ``--checkpoint-step`` rank 0 saves the sampler and dataset states crash-safely; with
``--hang-after-checkpoint`` the ranks then work on slowly, to be killed. A start that finds the checkpoint
resumes from it on whatever world size torchrun gave: the same command line, no manual step. Warnings of the
remote layer (waits, re-fetched blocks) go to stderr with the time and the process.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path
from typing import Any

import orjson
import torch
import torch.distributed as dist
import xxhash
from torchdata.stateful_dataloader import StatefulDataLoader

from tokenloom.datasets import MemoryMappedDataset, PackedSFTDataset
from tokenloom.formats.io import atomic_write_bytes
from tokenloom.sampler import ResumableDistributedSampler, sampler_state_from_loader

SEED = 4321
RECORDS_WIDTH = 16  # store records packed into one SFT sample, at most (-1 padded)


def digest(sample: dict[str, torch.Tensor]) -> int:
    """The xxh64 of a sample's input_ids and labels (int64 bytes), as a signed 63-bit number."""
    data = sample["input_ids"].to(torch.int64).numpy().tobytes() + sample["labels"].to(torch.int64).numpy().tobytes()
    return xxhash.xxh64_intdigest(data) >> 1


class ChaosDataset(torch.utils.data.Dataset):
    """Native windows, then packed SFT sequences, each with its identity and the digest of its bytes."""

    def __init__(self, native: str | os.PathLike[str], sft: str | os.PathLike[str], seq_len: int) -> None:
        self.native = MemoryMappedDataset(native, seq_len, pack_sequences=True)
        self.sft = PackedSFTDataset(sft, seq_len)

    def __len__(self) -> int:
        return len(self.native) + len(self.sft)

    def identity(self, index: int) -> tuple[int, int, list[int]]:
        """(0 native / 1 sft, the index in that dataset, the store records packed into it)."""
        if index < len(self.native):
            return 0, index, []
        local = index - len(self.native)
        return 1, local, self.sft.conversations(local)

    def __getitem__(self, index: int) -> dict[str, Any]:
        source, local, records = self.identity(index)
        sample = (self.native if source == 0 else self.sft)[local]
        padded = records + [-1] * (RECORDS_WIDTH - len(records))
        return {
            "identity": torch.tensor([source, local]),
            "records": torch.tensor(padded[:RECORDS_WIDTH]),
            "digest": torch.tensor(digest(sample)),
        }

    def fingerprint(self) -> str:
        return xxhash.xxh3_128_hexdigest(orjson.dumps([self.native.state_dict(), self.sft.fingerprint()]))

    def state_dict(self) -> dict[str, Any]:
        return {"native": self.native.state_dict(), "sft": self.sft.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.native.load_state_dict(state["native"])
        self.sft.load_state_dict(state["sft"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--native", required=True)
    parser.add_argument("--sft", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--checkpoint-step", type=int, default=-1)
    parser.add_argument("--hang-after-checkpoint", action="store_true")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    logging.basicConfig(level=logging.WARNING, format=f"%(created).3f rank{rank} pid%(process)d %(name)s: %(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / f"rank{rank}.pid", str(os.getpid()).encode())
    dataset = ChaosDataset(args.native, args.sft, args.seq_len)
    sampler = ResumableDistributedSampler(dataset, num_replicas=world, rank=rank, seed=SEED, pad=False)
    checkpoint = Path(args.checkpoint)
    if checkpoint.exists():  # a restart: continue from the saved position on this world size
        saved = orjson.loads(checkpoint.read_bytes())
        dataset.load_state_dict(saved["dataset"])  # refuses other data
        sampler.load_state_dict(saved["sampler"])
    dist.barrier()  # every rank has read the checkpoint before rank 0 may write another
    loader = StatefulDataLoader(dataset, sampler=sampler, batch_size=args.batch_size, num_workers=args.workers)
    log = open(out / f"rank{rank}.jsonl", "ab")  # noqa: SIM115 - open for the job's life
    for step, batch in enumerate(loader):
        line = {"rank": rank, "world": world, "step": step, "identity": batch["identity"].tolist()}
        line |= {"records": batch["records"].tolist(), "digest": batch["digest"].tolist()}
        log.write(orjson.dumps(line) + b"\n")
        log.flush()
        os.fsync(log.fileno())
        if step + 1 == args.checkpoint_step:
            state = {"sampler": sampler_state_from_loader(loader.state_dict()), "dataset": dataset.state_dict()}
            if rank == 0:
                atomic_write_bytes(checkpoint, orjson.dumps(state))
            dist.barrier()
        if args.hang_after_checkpoint and step + 1 >= args.checkpoint_step:
            time.sleep(0.5)  # keep working slowly: the test SIGKILLs a rank mid-epoch
    log.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
