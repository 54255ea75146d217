"""Hugging Face ``Trainer`` with tokenloom's sampler: exact resume inside Trainer checkpoints, on any world size.

Why: ``Trainer`` resumes data by re-iterating its loader and skipping the batches it already trained on
(``skip_first_batches``): slow, and wrong once the number of processes changes. tokenloom's order is one
number of state on any topology, so this helper

- builds the training loader itself: :class:`~tokenloom.sampler.ResumableDistributedSampler` over the
  ranks Trainer runs on (``args.world_size``, ``args.process_index``), batched here, not re-sharded by
  accelerate (accelerate's ``BatchSamplerShard`` would split a rank-aware sampler a second time);
- records, with every batch the training loop takes, the sampler state after that batch (the sampler runs
  ahead of training when DataLoader workers prefetch, so its live state is not what was trained on);
- writes that state into the checkpoint's ``trainer_state.json`` (``stateful_callbacks``), the same file
  and the same atomic write as Trainer's own step counter, and loads it back on
  ``trainer.train(resume_from_checkpoint=...)``;
- turns Trainer's batch skipping off (``args.ignore_data_skip = True``): the sampler already starts where
  the checkpoint stopped, so skipping would drop data a second time.

Trainer's epochs become counts of steps: the order runs on across tokenloom epochs (``set_epoch`` from
Trainer is ignored); stop a run with ``max_steps``.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

from torch.utils.data import DataLoader, IterableDataset

from tokenloom.formats.errors import ConfigError, ResumeMismatchError
from tokenloom.sampler import ResumableDistributedSampler

_MISSING_HF = (
    'the Trainer helper needs transformers and accelerate: pip install "tokenloom-datasets[hf]" (from a checkout: '
    "uv sync --all-packages --all-extras)"
)

_HAVE_HF = True
if TYPE_CHECKING:
    from transformers import Trainer, TrainerCallback
else:
    try:
        from transformers import Trainer, TrainerCallback
    except ImportError:  # without the hf extra the names still import (tokenloom.datasets.__all__); use says why
        _HAVE_HF = False
        Trainer = Any

        class TrainerCallback:
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                raise ImportError(_MISSING_HF)


__all__ = ["STATE_KEY", "ResumableSamplerCallback", "use_resumable_sampler"]

#: the key of the sampler state in ``trainer_state.json``'s ``stateful_callbacks``
STATE_KEY = "tokenloom_sampler"


class _CommittedBatches:
    """A batch sampler over a ResumableDistributedSampler that remembers the state after each batch it hands out.

    :meth:`commit` is called as the training loop takes a batch; ``committed`` is then the state to resume
    from. Every new iteration starts from ``committed``, so batches prefetched and never trained on (an
    abandoned iterator, DataLoader workers' read-ahead) are served again, not lost.
    """

    def __init__(self, sampler: ResumableDistributedSampler, batch_size: int, drop_last: bool) -> None:
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.committed: dict[str, Any] | None = None
        self._pending: deque[dict[str, Any]] = deque()
        identity = sampler.state_dict()  # this rank's share of a whole epoch, whatever the position now
        count = len(
            ResumableDistributedSampler(
                identity["n"],
                sampler.num_replicas,
                sampler.rank,
                shuffle=False,
                drop_last=identity["drop_last"],
                pad=identity["pad"],
            )
        )
        self._batches_per_epoch = count // batch_size if drop_last else -(-count // batch_size)

    def __len__(self) -> int:
        """Batches of a whole epoch on this rank: Trainer's steps per epoch (the order itself runs on)."""
        return self._batches_per_epoch

    def __iter__(self) -> Iterator[list[int]]:
        self._pending.clear()
        if self.committed is not None:
            self.sampler.load_state_dict(self.committed)
        empty_epochs = 0
        while empty_epochs < 2:  # a whole epoch with nothing for this rank: stop instead of spinning
            handed_out = False
            batch: list[int] = []
            for index in self.sampler:  # the sampler moves to its next epoch when this one is done
                batch.append(index)
                if len(batch) == self.batch_size:
                    self._pending.append(self.sampler.state_dict())
                    handed_out = True
                    yield batch
                    batch = []
            if batch and not self.drop_last:
                self._pending.append(self.sampler.state_dict())
                handed_out = True
                yield batch
            empty_epochs = 0 if handed_out else empty_epochs + 1

    def commit(self) -> None:
        self.committed = self._pending.popleft()


class _TrainerLoader(DataLoader):
    """A DataLoader that commits its batch sampler's state for each batch it yields to the training loop."""

    def __iter__(self) -> Iterator[Any]:  # pyright: ignore[reportIncompatibleMethodOverride] - a generator
        batches = cast(_CommittedBatches, self.batch_sampler)
        for batch in super().__iter__():
            batches.commit()
            yield batch


class _KeepModelInputs:
    """Drop the batch keys the model's ``forward`` does not take (``doc_ids``, ``cu_seqlens``, ...), as Trainer
    does with ``remove_unused_columns``. A top-level class: DataLoader workers pickle it."""

    def __init__(self, collator: Callable[[Any], Any], keep: frozenset[str] | None) -> None:
        self.collator = collator
        self.keep = keep

    def __call__(self, samples: Any) -> Any:
        batch = self.collator(samples)
        if self.keep is None or not isinstance(batch, Mapping):
            return batch
        return {key: value for key, value in batch.items() if key in self.keep}


def _model_inputs(trainer: Trainer) -> frozenset[str] | None:
    if not trainer.args.remove_unused_columns:
        return None
    own = getattr(trainer, "_set_signature_columns_if_needed", None)
    if callable(own):  # Trainer's own columns: it inspects a PEFT model's base model, whose forward names its inputs
        own()
        columns = getattr(trainer, "_signature_columns", None)
        if columns:
            return frozenset(columns)
    model = trainer.accelerator.unwrap_model(trainer.model) if hasattr(trainer, "accelerator") else trainer.model
    if model is None:
        return None
    names = set(inspect.signature(model.forward).parameters)
    return frozenset(names | {"label", "label_ids", "labels"} | set(trainer.args.label_names or ()))


class ResumableSamplerCallback(TrainerCallback):
    """Carries the sampler state in and out of Trainer checkpoints; made by :func:`use_resumable_sampler`."""

    def __init__(self, trainer: Trainer, sampler_options: Mapping[str, Any]) -> None:
        self.trainer = trainer
        self.sampler_options = dict(sampler_options)
        self.batches: _CommittedBatches | None = None

    @property
    def sampler(self) -> ResumableDistributedSampler | None:
        """The sampler of the current ``train()`` (None before the loader is built)."""
        return None if self.batches is None else self.batches.sampler

    def state_dict(self) -> dict[str, Any] | None:
        """The sampler state after the last batch the training loop took (None before the first)."""
        return None if self.batches is None else self.batches.committed

    def make_train_dataloader(self) -> DataLoader:
        """Replaces ``trainer.get_train_dataloader``: this rank's batches from the resumable sampler."""
        trainer, args = self.trainer, self.trainer.args
        dataset = trainer.train_dataset
        if (
            dataset is None
            or isinstance(dataset, IterableDataset)  # has Dataset's __getitem__, maybe a __len__: still a stream
            or not hasattr(dataset, "__len__")
            or not hasattr(dataset, "__getitem__")
        ):
            raise ConfigError(
                f"the resumable sampler needs a map-style train_dataset (len and [i]), got {type(dataset).__name__}",
                field="train_dataset",
                hint="Pass a tokenloom dataset (MemoryMappedDataset, PackedDocumentDataset, DatasetFactory.load, ...)",
            )
        sampler = ResumableDistributedSampler(
            dataset, num_replicas=args.world_size, rank=args.process_index, **self.sampler_options
        )
        # Trainer's own batch size: auto_find_batch_size may lower it below the argument
        batch_size = getattr(trainer, "_train_batch_size", None) or args.train_batch_size
        self.batches = _CommittedBatches(sampler, batch_size, args.dataloader_drop_last)
        workers = args.dataloader_num_workers
        extra: dict[str, Any] = {}
        if workers > 0:
            extra = {
                "persistent_workers": args.dataloader_persistent_workers,
                "prefetch_factor": args.dataloader_prefetch_factor,
                "multiprocessing_context": args.dataloader_multiprocessing_context,
            }
        return _TrainerLoader(
            cast(Any, dataset),
            batch_sampler=self.batches,
            collate_fn=_KeepModelInputs(trainer.data_collator, _model_inputs(trainer)),
            num_workers=workers,
            pin_memory=args.dataloader_pin_memory,
            **extra,
        )

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        saved = (state.stateful_callbacks or {}).get(STATE_KEY)
        if self.batches is None:
            return
        if saved is None:
            if state.global_step > 0:
                raise ResumeMismatchError(
                    f"the checkpoint at step {state.global_step} holds no tokenloom sampler state "
                    f"(trainer_state.json: stateful_callbacks.{STATE_KEY})",
                    field=STATE_KEY,
                    hint="Resume from a checkpoint saved with use_resumable_sampler, or start afresh",
                )
            return
        self.batches.sampler.load_state_dict(dict(saved))  # a foreign state fails here, before any step
        self.batches.committed = dict(saved)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # before Trainer's save of this step: trainer_state.json then carries the state with the step counter
        if self.batches is not None and self.batches.committed is not None:
            state.stateful_callbacks[STATE_KEY] = dict(self.batches.committed)


def use_resumable_sampler(trainer: Trainer, **sampler_options: Any) -> ResumableSamplerCallback:
    """Give ``trainer`` tokenloom's resumable sampler; its state rides inside Trainer's checkpoints.

    ``sampler_options`` go to :class:`~tokenloom.sampler.ResumableDistributedSampler` (``seed``, ``shuffle``,
    ``drop_last``, ``pad``, ``order``, ...); the ranks come from ``trainer.args``. Any map-style dataset works.
    ``trainer.train(resume_from_checkpoint=...)`` then continues the order exactly, also on another number
    of processes (set ``max_steps`` for the whole run: a step trains ``world_size x batch size`` samples).
    """
    if not _HAVE_HF:
        raise ImportError(_MISSING_HF)
    for name in ("num_replicas", "rank", "dataset_or_length"):
        if name in sampler_options:
            raise ConfigError(
                f"use_resumable_sampler sets {name} itself (from trainer.args and trainer.train_dataset)",
                field=name,
                hint=f"Leave {name} out",
            )
    if not sampler_options.get("pad", True):
        raise ConfigError(
            "use_resumable_sampler with pad=False: the ranks would get unequal shares of an epoch, drift apart "
            "across Trainer's lock-step steps, and the saved position would repeat or skip samples",
            field="pad",
            hint="Leave pad at its default (True) or pass drop_last=True",
        )
    for method in ("get_train_dataloader", "_get_train_sampler"):
        if getattr(type(trainer), method, None) is not getattr(Trainer, method, None):
            raise ConfigError(
                f"{type(trainer).__name__} overrides Trainer.{method}; use_resumable_sampler replaces the training "
                "loader and its sampler, so that override would be silently ignored",
                field=method,
                hint=f"Drop the {method} override (the helper builds the loader), or build the loader yourself "
                "around ResumableDistributedSampler without use_resumable_sampler",
            )
    callback = ResumableSamplerCallback(trainer, sampler_options)
    trainer.get_train_dataloader = callback.make_train_dataloader  # type: ignore[method-assign]
    trainer.args.ignore_data_skip = True  # the sampler resumes; Trainer's batch skipping would skip again
    trainer.add_callback(callback)
    return callback
