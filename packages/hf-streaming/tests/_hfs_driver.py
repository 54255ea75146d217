"""A training loop in a subprocess: W simulated ranks stepping in lock-step, each with its own
StatefulDataLoader, checkpointing every rank's loader state and optionally SIGKILLing itself.

Usage: python stream_driver.py CONFIG.json. Writes one JSON line per (step, rank) to the log:
the window tokens and their source document ids, so a test can rebuild every document.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from torchdata.stateful_dataloader import StatefulDataLoader

from tokenloom.hf_streaming import (
    StreamingHuggingFaceDataset,
    load_rank_states,
    merge_rank_states,
    save_rank_state,
)


def main(config_path: str) -> None:
    config = json.loads(Path(config_path).read_text())
    world, workers = config["world_size"], config["num_workers"]
    state_dir = Path(config["state_dir"])
    resume = config.get("resume", "none")
    saved = load_rank_states(state_dir / "current") if resume != "none" else None
    dataset = dict(config["dataset"])
    if isinstance(dataset.get("retries"), dict):  # JSON carries the policy's fields
        from tokenloom.formats.remote import RetryPolicy

        dataset["retries"] = RetryPolicy(**dataset["retries"])
    loaders = []
    for rank in range(world):
        ds = StreamingHuggingFaceDataset(**dataset, rank=rank, world_size=world)
        if resume == "merge" and saved is not None:
            ds.load_state_dict(merge_rank_states([s["loader"] for s in saved]))
        loader = StatefulDataLoader(
            ds, batch_size=config["batch_size"], num_workers=workers, timeout=120 if workers else 0
        )
        if resume == "same":
            assert saved is not None
            loader.load_state_dict(saved[rank]["loader"])
        loaders.append(loader)
    iterators = [iter(loader) for loader in loaders]
    done = [False] * world
    start_step = saved[0]["step"] if saved and resume == "same" else 0
    step = start_step
    with open(config["log"], "a") as log:
        while not all(done):
            step += 1
            for rank in range(world):
                if done[rank]:
                    continue
                try:
                    batch = next(iterators[rank])
                except StopIteration:
                    done[rank] = True
                    continue
                record = {
                    "step": step,
                    "rank": rank,
                    "input_ids": batch["input_ids"].tolist(),
                    "labels": batch["labels"].tolist(),
                    "doc_index": batch["doc_index"].tolist(),
                    "label_doc_index": batch["label_doc_index"].tolist(),
                }
                log.write(json.dumps(record) + "\n")
            log.flush()
            if config.get("save_every") and step % config["save_every"] == 0:
                tag = config.get("tag", "")
                tmp = state_dir / f"{tag}step{step}"
                for rank in range(world):
                    save_rank_state(tmp, rank, {"step": step, "loader": loaders[rank].state_dict()})
                # publish the checkpoint of every rank at once
                (state_dir / "latest").write_text(str(step))
                os.replace(tmp, state_dir / f"{tag}ckpt{step}")
                current = state_dir / "current"
                if current.is_symlink() or current.exists():
                    current.unlink()
                current.symlink_to(f"{tag}ckpt{step}")
            if config.get("kill_at_step") and step == config["kill_at_step"]:
                os.kill(os.getpid(), signal.SIGKILL)
            if config.get("max_steps") and step - start_step >= config["max_steps"]:
                break


if __name__ == "__main__":
    main(sys.argv[1])
