"""Catalogue rows for wave 4's trainers item (#39): a data position from elsewhere, handed to Trainer or DCP."""

from __future__ import annotations

from pathlib import Path

from _catalogue_base import Run, case, copy


def _other_native(tmp: Path) -> Path:
    """A native dataset with as many windows as the catalogue's, other tokens (so another fingerprint)."""
    import numpy as np

    from tokenloom.datasets import MemoryMappedDataset
    from tokenloom.formats import open_writer

    reference = len(MemoryMappedDataset(copy("native", tmp / "ref"), seq_len=4))
    target = tmp / "other"
    with open_writer(target, format="native", dtype="uint16", vocab_size=256, eos_id=0) as writer:
        writer.add(np.append(np.arange(1, reference * 5) % 250 + 1, 0))
    return target


@case("DCP data entry that is not JSON", "silent", "error", "FormatError")
def _(tmp: Path) -> Run:
    from tokenloom.datasets import SamplerCheckpoint
    from tokenloom.sampler import ResumableDistributedSampler

    checkpoint = SamplerCheckpoint(ResumableDistributedSampler(10, 1, 0))
    return Run(call=lambda: checkpoint.load_state_dict({"tokenloom_sampler_json": '{"epoch": 0,'}))


@case("DCP checkpoint of another dataset of the same length", "silent", "error", "ResumeMismatchError")
def _(tmp: Path) -> Run:
    import torch.distributed.checkpoint as dcp

    from tokenloom.datasets import MemoryMappedDataset, SamplerCheckpoint
    from tokenloom.sampler import ResumableDistributedSampler

    ours = MemoryMappedDataset(copy("native", tmp), seq_len=4)
    other = MemoryMappedDataset(_other_native(tmp), seq_len=4)
    if len(other) != len(ours):
        raise RuntimeError(f"fixture: {len(other)} windows, expected {len(ours)}")
    saved = {"data": SamplerCheckpoint(ResumableDistributedSampler(ours, 1, 0))}
    dcp.save(saved, checkpoint_id=tmp / "c", no_dist=True)
    target = {"data": SamplerCheckpoint(ResumableDistributedSampler(other, 1, 0))}
    return Run(call=lambda: dcp.load(target, checkpoint_id=tmp / "c", no_dist=True))


def _trainer_resume(tmp: Path, dataset_path: Path, saved: dict | None) -> Run:
    """What train(resume_from_checkpoint=...) does once Trainer has read trainer_state.json (state at step 3)."""
    import transformers

    from tokenloom.datasets import MemoryMappedDataset, collate, use_resumable_sampler

    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=1
    )
    args = transformers.TrainingArguments(str(tmp / "run"), max_steps=6, report_to=[], use_cpu=True)
    dataset = MemoryMappedDataset(dataset_path, seq_len=4)
    trainer = transformers.Trainer(
        model=transformers.LlamaForCausalLM(config), args=args, train_dataset=dataset, data_collator=collate
    )
    callback = use_resumable_sampler(trainer, seed=1)
    trainer.get_train_dataloader()
    callbacks = {} if saved is None else {"tokenloom_sampler": saved}
    state = transformers.TrainerState(global_step=3, stateful_callbacks=callbacks)
    return Run(call=lambda: callback.on_train_begin(args, state, transformers.TrainerControl()))


@case("Trainer checkpoint without the tokenloom sampler state", "silent", "error", "ResumeMismatchError")
def _(tmp: Path) -> Run:
    return _trainer_resume(tmp, copy("native", tmp), None)


@case("Trainer checkpoint whose sampler state is of another dataset", "silent", "error", "ResumeMismatchError")
def _(tmp: Path) -> Run:
    from tokenloom.datasets import MemoryMappedDataset
    from tokenloom.sampler import ResumableDistributedSampler

    ours = copy("native", tmp)
    saved = ResumableDistributedSampler(MemoryMappedDataset(_other_native(tmp), seq_len=4), 1, 0, seed=1).state_dict()
    return _trainer_resume(tmp, ours, saved)


def _plain_trainer(tmp: Path, cls: type | None = None):
    import transformers

    from tokenloom.datasets import MemoryMappedDataset, collate

    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=1
    )
    args = transformers.TrainingArguments(str(tmp / "run"), max_steps=2, report_to=[], use_cpu=True)
    dataset = MemoryMappedDataset(copy("native", tmp), seq_len=4)
    return (cls or transformers.Trainer)(
        model=transformers.LlamaForCausalLM(config), args=args, train_dataset=dataset, data_collator=collate
    )


@case("Trainer sampler with pad=False (ranks out of lock-step)", "silent", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.datasets import use_resumable_sampler

    trainer = _plain_trainer(tmp)
    return Run(call=lambda: use_resumable_sampler(trainer, pad=False))


@case("Trainer subclass overriding get_train_dataloader", "silent", "error", "ConfigError")
def _(tmp: Path) -> Run:
    import transformers

    from tokenloom.datasets import use_resumable_sampler

    class OwnLoader(transformers.Trainer):
        def get_train_dataloader(self):
            return super().get_train_dataloader()

    trainer = _plain_trainer(tmp, OwnLoader)
    return Run(call=lambda: use_resumable_sampler(trainer))


@case("Trainer train_dataset an IterableDataset with a length", "traceback", "error", "ConfigError")
def _(tmp: Path) -> Run:
    import torch.utils.data

    from tokenloom.datasets import use_resumable_sampler

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(4))

        def __len__(self):
            return 4

    trainer = _plain_trainer(tmp)
    use_resumable_sampler(trainer)
    trainer.train_dataset = Stream()
    return Run(call=trainer.get_train_dataloader)
