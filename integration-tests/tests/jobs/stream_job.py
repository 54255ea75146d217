"""A data-parallel job streaming local jsonl through StreamingHuggingFaceDataset, launched by torchrun.

Every rank iterates a StatefulDataLoader (real workers) and appends per step its whole
batch (input_ids, labels, doc_index, label_doc_index) to ``OUT/rank<r>.jsonl``, fsynced.
At ``--checkpoint-step`` every rank saves its loader state with save_rank_state; with
``--hang-after-checkpoint`` the ranks keep working slowly so the test can SIGKILL them.
``--resume same`` loads each rank's own loader state (same topology, bit-exact);
``--resume merge`` merges every saved rank state into the dataset (any topology).
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

from tokenloom.hf_streaming import StreamingHuggingFaceDataset, load_rank_states, merge_rank_states, save_rank_state

UNIT_BYTES = 4096  # many small byte-range units, so 4 and 3 slots both have work


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", nargs="+", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--checkpoint-step", type=int, default=-1)
    parser.add_argument("--start-step", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--hang-after-checkpoint", action="store_true")
    parser.add_argument("--resume", choices=["none", "same", "merge"], default="none")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = StreamingHuggingFaceDataset(
        "json", "train", "text", seq_len=args.seq_len, tokenizer_path=args.tokenizer, rank=rank, world_size=world,
        seed=args.seed, pack_sequences=True, with_provenance=True, data_files=args.files, unit_bytes=UNIT_BYTES,
    )  # fmt: skip
    if args.resume == "merge":
        dataset.load_state_dict(merge_rank_states(load_rank_states(args.state_dir)))
    loader = StatefulDataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers, timeout=120)
    if args.resume == "same":
        loader.load_state_dict(load_rank_states(args.state_dir, world)[rank])
    dist.barrier()  # every rank has read the saved states before any rank may overwrite its own
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / f"rank{rank}.jsonl", "ab")  # noqa: SIM115 - open for the job's life
    step = args.start_step
    for batch in loader:
        record = {"rank": rank, "world": world, "step": step}
        record.update({key: batch[key].tolist() for key in ("input_ids", "labels", "doc_index", "label_doc_index")})
        log.write(orjson.dumps(record) + b"\n")
        log.flush()
        os.fsync(log.fileno())
        step += 1
        if step == args.checkpoint_step:
            save_rank_state(args.state_dir, rank, loader.state_dict())
            dist.barrier()
        if args.hang_after_checkpoint and step >= args.checkpoint_step:
            time.sleep(0.5)  # keep working slowly; the test SIGKILLs the job mid-flight
        if step == args.max_steps:
            break
    log.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
