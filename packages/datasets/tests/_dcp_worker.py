"""A rank of the DCP resume test (spawned by test_checkpoint.py; not a test module).

``save``: 2 ranks read ``steps`` batches through a StatefulDataLoader with a worker (read-ahead), save the
data position with torch.distributed.checkpoint next to a model tensor, then read on (work a crash loses).
``load``: another number of ranks load the checkpoint into fresh samplers and read to the end of the epoch.
Each rank writes the rows it consumed (hashes of ``input_ids``) per batch to ``<out>/<phase>-rank<r>.json``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from datasets_helpers import init_gloo


def row_hash(row) -> str:
    return hashlib.blake2b(row.numpy().astype("int64").tobytes(), digest_size=8).hexdigest()


def run(rank: int, world_size: int, phase: str, data: str, tmp: str, steps: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint import state_dict_loader, state_dict_saver
    from torchdata.stateful_dataloader import StatefulDataLoader

    from tokenloom.datasets import MemoryMappedDataset, SamplerCheckpoint, collate
    from tokenloom.sampler import ResumableDistributedSampler

    init_gloo(f"file://{tmp}/init-{phase}", rank, world_size)
    dataset = MemoryMappedDataset(data, seq_len=16, pack_sequences=True)
    sampler = ResumableDistributedSampler(dataset, world_size, rank, seed=99)
    loader = StatefulDataLoader(  # fork: a spawned worker would import torch again (10-20 s)
        dataset, sampler=sampler, batch_size=2, num_workers=1, collate_fn=collate, multiprocessing_context="fork"
    )
    state = {"model": {"weight": torch.ones(4)}, "data": SamplerCheckpoint(loader)}
    checkpoint = f"{tmp}/dcp"
    consumed: list[list[str]] = []
    if phase == "save":
        iterator = iter(loader)
        for _ in range(steps):
            consumed.append([row_hash(row) for row in next(iterator)["input_ids"]])
        state_dict_saver.save(state, checkpoint_id=checkpoint)
        lost = [row_hash(row) for row in next(iterator)["input_ids"]]  # read after the checkpoint: lost in a crash
        Path(tmp, f"lost-rank{rank}.json").write_text(json.dumps(lost))
    else:
        state["model"]["weight"] = torch.zeros(4)
        state_dict_loader.load(state, checkpoint_id=checkpoint)
        assert state["model"]["weight"].tolist() == [1.0] * 4  # the model half of the checkpoint came back too
        consumed = [[row_hash(row) for row in batch["input_ids"]] for batch in loader]
    Path(tmp, f"{phase}-rank{rank}.json").write_text(json.dumps(consumed))
    dist.barrier()
    dist.destroy_process_group()
