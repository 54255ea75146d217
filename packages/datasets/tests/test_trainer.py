"""use_resumable_sampler: Hugging Face Trainer resumes tokenloom's order from its own checkpoints, skipping nothing.

One process, in-process Trainers on a tiny Llama from a local config (random weights, no download); the
torchrun runs on 2, 1 and 3 processes are in integration-tests/tests/test_hf_trainer_torchrun.py.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import orjson
import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from tokenloom.datasets import MemoryMappedDataset, ResumableSamplerCallback, collate, use_resumable_sampler  # noqa: E402
from tokenloom.formats import ConfigError, ResumeMismatchError, open_writer  # noqa: E402
from tokenloom.sampler import ResumableDistributedSampler  # noqa: E402

SEQ_LEN, BATCH, NUM_SAMPLES, SEED = 16, 2, 24, 77


def write_tokens(root: Path, seed: int = 1) -> MemoryMappedDataset:
    rng = np.random.default_rng(seed)
    remaining = NUM_SAMPLES * (SEQ_LEN + 1)
    with open_writer(root, dtype="uint16", vocab_size=128, eos_id=0) as writer:
        while remaining:
            length = min(remaining, int(rng.integers(4, 30)))
            writer.add(np.append(rng.integers(1, 128, size=length - 1), 0))
            remaining -= length
    return MemoryMappedDataset(root, seq_len=SEQ_LEN, pack_sequences=True, position_ids=True)


def row_hash(row) -> str:
    return hashlib.blake2b(row.numpy().astype("int64").tobytes(), digest_size=8).hexdigest()


class RecordingTrainer(transformers.Trainer):
    """Records the rows each optimizer step trains on (the oracle)."""

    steps: dict[int, list[str]]

    def training_step(self, model, inputs, num_items_in_batch=None):  # type: ignore[override]
        self.steps.setdefault(self.state.global_step + 1, []).extend(row_hash(r) for r in inputs["input_ids"].cpu())
        return super().training_step(model, inputs, num_items_in_batch)


def make_trainer(out: Path, dataset, *, max_steps: int, workers: int = 0, helper: bool = True) -> RecordingTrainer:
    import torch

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=SEQ_LEN,
    )  # fmt: skip
    args = transformers.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=BATCH, max_steps=max_steps, save_strategy="steps",
        save_steps=3, logging_steps=1000, report_to=[], use_cpu=True, dataloader_num_workers=workers,
        disable_tqdm=True, save_only_model=False,
    )  # fmt: skip
    trainer = RecordingTrainer(
        model=transformers.LlamaForCausalLM(config), args=args, train_dataset=dataset, data_collator=collate
    )
    trainer.steps = {}
    if helper:
        use_resumable_sampler(trainer, seed=SEED)
    return trainer


def test_resume_from_a_trainer_checkpoint_continues_the_order_with_nothing_skipped_or_repeated(tmp_path):
    dataset = write_tokens(tmp_path / "tokens")
    index_of = {row_hash(dataset[i]["input_ids"]): i for i in range(NUM_SAMPLES)}
    assert len(index_of) == NUM_SAMPLES
    order = ResumableDistributedSampler(NUM_SAMPLES, 1, 0, seed=SEED).indices_at(np.arange(NUM_SAMPLES)).tolist()

    first = make_trainer(tmp_path / "run", dataset, max_steps=5, workers=1)  # a worker reads ahead
    assert first.args.ignore_data_skip  # Trainer's own skipping would skip the checkpoint's batches again
    first.train()
    checkpoint = tmp_path / "run" / "checkpoint-3"
    saved = orjson.loads((checkpoint / "trainer_state.json").read_bytes())["stateful_callbacks"]["tokenloom_sampler"]
    assert (saved["epoch"], saved["consumed"]) == (0, 3 * BATCH)

    resumed = make_trainer(tmp_path / "resumed", dataset, max_steps=NUM_SAMPLES // BATCH)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    before = [index_of[h] for step in (1, 2, 3) for h in first.steps[step]]
    after = [index_of[h] for step in sorted(resumed.steps) for h in resumed.steps[step]]
    assert min(resumed.steps) == 4
    assert before + after == order  # the uninterrupted order: every sample once


def test_a_checkpoint_without_the_sampler_state_or_of_another_dataset_is_refused(tmp_path):
    dataset = write_tokens(tmp_path / "tokens")
    make_trainer(tmp_path / "plain", dataset, max_steps=3, helper=False).train()
    with pytest.raises(ResumeMismatchError, match="holds no tokenloom sampler state"):
        make_trainer(tmp_path / "a", dataset, max_steps=6).train(
            resume_from_checkpoint=str(tmp_path / "plain" / "checkpoint-3")
        )

    make_trainer(tmp_path / "ours", dataset, max_steps=3).train()
    other = write_tokens(tmp_path / "other", seed=2)  # same length, other tokens
    with pytest.raises(ResumeMismatchError, match="data_fingerprint|dataset"):
        make_trainer(tmp_path / "b", other, max_steps=6).train(
            resume_from_checkpoint=str(tmp_path / "ours" / "checkpoint-3")
        )


def test_the_helper_owns_the_ranks_and_needs_a_map_style_dataset(tmp_path):
    dataset = write_tokens(tmp_path / "tokens")
    trainer = make_trainer(tmp_path / "x", dataset, max_steps=1, helper=False)
    with pytest.raises(ConfigError, match="num_replicas"):
        use_resumable_sampler(trainer, num_replicas=2)
    callback = use_resumable_sampler(trainer, seed=1)
    assert isinstance(callback, ResumableSamplerCallback) and callback.state_dict() is None
    trainer.train_dataset = iter(range(3))  # type: ignore[assignment]
    with pytest.raises(ConfigError, match="map-style"):
        trainer.get_train_dataloader()
