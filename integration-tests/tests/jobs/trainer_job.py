"""A Hugging Face Trainer job over a packed tokenloom dataset, with tokenloom's resumable sampler.

A tiny Llama built from a local config (random weights, no download) trains on CPU under torchrun (gloo).
Every rank writes, for each optimizer step, the rows of ``input_ids`` it trained on to ``<out>/rank<r>.jsonl``
(as hashes): the test's oracle of consumed samples. ``--kill-at-step`` SIGKILLs rank 0 at the end of that step.
Run it with ``torchrun --nproc-per-node=N trainer_job.py ...``; the test calls :func:`main` through torchrun's
launcher with forked ranks instead (one import of transformers for every run).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
from pathlib import Path

import orjson
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

from tokenloom.datasets import MemoryMappedDataset, collate, use_resumable_sampler


def row_hash(row: torch.Tensor) -> str:
    return hashlib.blake2b(row.numpy().astype("int64").tobytes(), digest_size=8).hexdigest()


class RecordingTrainer(Trainer):
    """Writes what each step trains on, per rank (the oracle); nothing else changes."""

    record_path: Path

    def training_step(self, model, inputs, num_items_in_batch=None):  # type: ignore[override]
        rows = [row_hash(row) for row in inputs["input_ids"].cpu()]
        line = {"step": self.state.global_step + 1, "rank": self.args.process_index, "rows": rows}
        with self.record_path.open("ab") as file:
            file.write(orjson.dumps(line) + b"\n")
        return super().training_step(model, inputs, num_items_in_batch)


class KillAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step and args.process_index == 0:
            os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--save-steps", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--kill-at-step", type=int, default=0)
    parser.add_argument("--resume", default=None)
    options = parser.parse_args(argv)
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    dataset = MemoryMappedDataset(options.data, seq_len=options.seq_len, pack_sequences=True, position_ids=True)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=options.seq_len,
    )
    args = TrainingArguments(
        output_dir=str(out / "checkpoints"),
        per_device_train_batch_size=options.batch_size,
        max_steps=options.max_steps,
        save_strategy="steps",
        save_steps=options.save_steps,
        logging_steps=1000,
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        dataloader_num_workers=options.workers,
        disable_tqdm=True,
        learning_rate=1e-3,
        seed=0,
        ddp_timeout=90,  # a rank left alone in a collective fails instead of hanging the test
    )
    trainer = RecordingTrainer(model=LlamaForCausalLM(config), args=args, train_dataset=dataset, data_collator=collate)
    trainer.record_path = out / f"rank{args.process_index}.jsonl"
    use_resumable_sampler(trainer, seed=1234)
    if options.kill_at_step:
        trainer.add_callback(KillAt(options.kill_at_step))
    trainer.train(resume_from_checkpoint=options.resume)


if __name__ == "__main__":
    main()
