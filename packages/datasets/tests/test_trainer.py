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
from datasets_helpers import write_random_docs

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
import torch  # noqa: E402

from tokenloom.datasets import MemoryMappedDataset, ResumableSamplerCallback, collate, use_resumable_sampler  # noqa: E402
from tokenloom.formats import ConfigError, ResumeMismatchError  # noqa: E402
from tokenloom.sampler import ResumableDistributedSampler  # noqa: E402

SEQ_LEN, BATCH, NUM_SAMPLES, SEED = 16, 2, 24, 77


def write_tokens(root: Path, seed: int = 1) -> MemoryMappedDataset:
    write_random_docs(root, NUM_SAMPLES * (SEQ_LEN + 1), seed=seed, vocab_size=128, max_length=30)
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


RAGGED_SEED, RAGGED_BATCH, ACCUMULATE = 5, 5, 2  # 24 samples: batches 5, 5, 5, 5, 4 per epoch; a step takes 2 batches


def make_accumulating(out, dataset, *, max_steps: int, eval_dataset=None) -> RecordingTrainer:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16,
    )  # fmt: skip
    args = transformers.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=RAGGED_BATCH, gradient_accumulation_steps=ACCUMULATE,
        max_steps=max_steps, save_strategy="steps", save_steps=2, logging_steps=3, report_to=[], use_cpu=True,
        dataloader_num_workers=2, dataloader_persistent_workers=True, disable_tqdm=True,
        eval_strategy="steps" if eval_dataset is not None else "no", eval_steps=3, per_device_eval_batch_size=4,
    )  # fmt: skip
    trainer = RecordingTrainer(
        model=transformers.LlamaForCausalLM(config),
        args=args,
        train_dataset=dataset,
        eval_dataset=eval_dataset,
        data_collator=collate,
    )
    trainer.steps = {}
    use_resumable_sampler(trainer, seed=RAGGED_SEED)
    return trainer


def test_accumulation_ragged_batches_workers_eval_and_two_chained_resumes_consume_the_order_once(tmp_path):
    dataset = write_tokens(tmp_path / "tokens")
    index_of = {row_hash(dataset[i]["input_ids"]): i for i in range(NUM_SAMPLES)}
    sampler = ResumableDistributedSampler(NUM_SAMPLES, 1, 0, seed=RAGGED_SEED)
    batches = [  # the order, batched within each epoch (a partial batch of 4 ends each epoch)
        order[i : i + RAGGED_BATCH].tolist()
        for epoch in range(3)
        for order in [sampler.indices_at(np.arange(NUM_SAMPLES), epoch=epoch)]
        for i in range(0, NUM_SAMPLES, RAGGED_BATCH)
    ]

    def rows(trainer, steps) -> list[int]:
        return [index_of[h] for step in steps for h in trainer.steps[step]]

    # evaluates at steps 3, 6 and the last (Trainer's own eval loader, untouched by the helper)
    whole = make_accumulating(tmp_path / "whole", dataset, max_steps=7, eval_dataset=dataset)
    whole.train()
    assert sorted(whole.steps) == list(range(1, 8))
    assert [log["step"] for log in whole.state.log_history if "eval_loss" in log] == [3, 6, 7]
    assert rows(whole, range(1, 8)) == [i for batch in batches[:12] for i in batch]  # 12 batches: 5 + 5 + 2

    # resume from checkpoint-2 although checkpoints 4 and 6 exist, save again, resume from that resume
    first = make_accumulating(tmp_path / "first", dataset, max_steps=5)
    first.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-2"))
    second = make_accumulating(tmp_path / "second", dataset, max_steps=7)
    second.train(resume_from_checkpoint=str(tmp_path / "first" / "checkpoint-4"))
    assert (sorted(first.steps), sorted(second.steps)) == ([3, 4, 5], [5, 6, 7])
    consumed = rows(whole, [1, 2]) + rows(first, [3, 4]) + rows(second, [5, 6, 7])
    flat = [i for batch in batches for i in batch]
    assert consumed == flat[: len(consumed)]  # the uninterrupted order from where each checkpoint stopped
    state = orjson.loads((tmp_path / "first" / "checkpoint-4" / "trainer_state.json").read_bytes())
    saved = state["stateful_callbacks"]["tokenloom_sampler"]
    trained = len(rows(whole, [1, 2]) + rows(first, [3, 4]))
    assert saved["epoch"] * NUM_SAMPLES + saved["consumed"] == trained  # the checkpoint holds what was trained


def test_a_trainer_that_brings_its_own_loader_or_sampler_is_refused(tmp_path):
    dataset = write_tokens(tmp_path / "tokens")

    class OwnLoader(RecordingTrainer):
        def get_train_dataloader(self):
            return super().get_train_dataloader()

    class OwnSampler(RecordingTrainer):
        def _get_train_sampler(self, train_dataset=None):
            return torch.utils.data.SequentialSampler(train_dataset or self.train_dataset)

    for cls, name in ((OwnLoader, "get_train_dataloader"), (OwnSampler, "_get_train_sampler")):
        args = transformers.TrainingArguments(output_dir=str(tmp_path / name), report_to=[], use_cpu=True)
        config = transformers.LlamaConfig(vocab_size=128, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=2)  # fmt: skip
        trainer = cls(model=transformers.LlamaForCausalLM(config), args=args, train_dataset=dataset)
        with pytest.raises(ConfigError, match=name):  # silently replacing the user's override would lose it
            use_resumable_sampler(trainer)


def test_unpadded_ranks_are_a_config_error(tmp_path):
    trainer = make_trainer(tmp_path / "x", write_tokens(tmp_path / "tokens"), max_steps=1, helper=False)
    # pad=False: ranks get unequal counts, drift apart over lock-step steps, the saved position repeats samples
    with pytest.raises(ConfigError, match="pad"):
        use_resumable_sampler(trainer, pad=False)


def test_an_iterable_dataset_with_a_length_is_a_config_error(tmp_path):
    trainer = make_trainer(tmp_path / "x", write_tokens(tmp_path / "tokens"), max_steps=1)

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(4))

        def __len__(self):
            return 4

    trainer.train_dataset = Stream()  # has __len__ and (Dataset's) __getitem__, yet is not map-style
    with pytest.raises(ConfigError, match="map-style"):
        trainer.get_train_dataloader()


class Wrapped(torch.nn.Module):
    """Stands in for a PEFT model: forward(*args, **kwargs) names no input, get_base_model() does."""

    def __init__(self, base):
        super().__init__()
        self.base = base
        self.config = base.config

    def get_base_model(self):
        return self.base

    def forward(self, *args, **kwargs):
        return self.base(*args, **kwargs)


@pytest.mark.parametrize("wrapped", [False, True])
def test_the_helper_keeps_the_batch_keys_trainer_keeps(tmp_path, monkeypatch, wrapped):
    trainer = make_trainer(tmp_path / "x", write_tokens(tmp_path / "tokens"), max_steps=1, helper=False)
    if wrapped:  # what Trainer does for a PEFT model (LoRA): inspect the base model's forward
        monkeypatch.setattr(transformers.trainer, "_is_peft_model", lambda model: isinstance(model, Wrapped))
        trainer.model = Wrapped(trainer.model)
    own = sorted(next(iter(trainer.get_train_dataloader())))
    assert "input_ids" in own and "position_ids" in own and "doc_ids" not in own
    use_resumable_sampler(trainer, seed=SEED)
    assert sorted(next(iter(trainer.get_train_dataloader()))) == own


def test_a_peft_model_keeps_its_inputs(tmp_path):
    peft = pytest.importorskip("peft")
    trainer = make_trainer(tmp_path / "x", write_tokens(tmp_path / "tokens"), max_steps=1, helper=False)
    trainer.model = peft.get_peft_model(trainer.model, peft.LoraConfig(r=2, target_modules=["q_proj"]))
    use_resumable_sampler(trainer, seed=SEED)
    assert sorted(next(iter(trainer.get_train_dataloader()))) == ["input_ids", "labels", "position_ids"]


def test_without_transformers_the_names_import_and_using_them_names_the_extra() -> None:
    """The release check imports every public name of a wheel installed alone: the module raised at import."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "sys.modules['transformers'] = None  # as if the hf extra were not installed\n"
        "import tokenloom.datasets as d\n"
        "d.ResumableSamplerCallback, d.use_resumable_sampler\n"
        "try:\n"
        "    d.use_resumable_sampler(object())\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert 'pip install "tokenloom-datasets[hf]"' in done.stdout
