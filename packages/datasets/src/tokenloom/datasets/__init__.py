"""tokenloom.datasets: tokens on disk -> the sample dicts a training loop consumes.

    open_dataset(path)              (tokenloom.formats: memory-mapped shards)
        -> MemoryMappedDataset      fixed windows, optional document packing
        -> PackedDocumentDataset    whole documents bin-packed into seq_len
        -> PackedSFTDataset         whole sft conversations bin-packed into seq_len, labels from loss_mask
        -> DatasetFactory.load      seq / sft / dpo / grpo over keyed stores
        -> MixtureDataset           weighted interleaving of any of them
        -> torch DataLoader         (``collate`` keeps ``__getitems__`` batches batched)

Every sample is a dict of 1-D tensors of one length L (``input_ids``, ``labels``
with -100 = ignored, and where asked ``doc_ids``, ``position_ids``,
``cu_seqlens``); :func:`build_sample` / :func:`build_batch` is the one
implementation of "tokens -> sample" that other packages reuse.

    >>> from tokenloom.datasets import MemoryMappedDataset, collate
    >>> ds = MemoryMappedDataset("data/", seq_len=2048, pack_sequences=True)
    >>> loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2, collate_fn=collate)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenloom.formats.io import lazy_exports

if TYPE_CHECKING:
    from tokenloom.datasets._batch import SampleBatch, SampleRow, WindowBatch, collate, stack_samples, windows_to_sample
    from tokenloom.datasets._binpack import PackingAlgorithm, best_fit_decreasing, length_binned_greedy, pack_order
    from tokenloom.datasets._checkpoint import SamplerCheckpoint
    from tokenloom.datasets._eos import documents_with_eos, resolve_eos_id
    from tokenloom.datasets._hf import HuggingFaceDataset, tokenizer_fingerprint
    from tokenloom.datasets._keyed import (
        ArrayStore,
        DatasetFactory,
        KeyedDataset,
        KeyedSource,
        MaskAlignment,
        TrainType,
    )
    from tokenloom.datasets._mixture import MixtureDataset, interleave, validate_weights
    from tokenloom.datasets._packed import PackedDocumentDataset
    from tokenloom.datasets._packed_sft import PackedSFTDataset
    from tokenloom.datasets._packing_plan import PackedIndex, PackingPlan, compute_plan
    from tokenloom.datasets._prefetch import PrefetchFromSampler
    from tokenloom.datasets._records import RecordDataset
    from tokenloom.datasets._sample import IGNORE_INDEX, Packing, build_batch, build_sample, to_torch
    from tokenloom.datasets._state import (
        check_state,
        data_fingerprint,
        data_objects,
        settings_fingerprint,
        with_objects,
    )
    from tokenloom.datasets._trainer import ResumableSamplerCallback, use_resumable_sampler
    from tokenloom.datasets._window_index import WindowIndex
    from tokenloom.datasets._windows import MemoryMappedDataset

#: Public name -> the module that defines it, imported on first use: ``import tokenloom.datasets`` (and every
#: ``tokenloom ... --help``) costs no torch until something that needs it is asked for.
_EXPORTS = {
    "IGNORE_INDEX": "tokenloom.datasets._sample",
    "ArrayStore": "tokenloom.datasets._keyed",
    "DatasetFactory": "tokenloom.datasets._keyed",
    "HuggingFaceDataset": "tokenloom.datasets._hf",
    "KeyedDataset": "tokenloom.datasets._keyed",
    "KeyedSource": "tokenloom.datasets._keyed",
    "MemoryMappedDataset": "tokenloom.datasets._windows",
    "MixtureDataset": "tokenloom.datasets._mixture",
    "PackedDocumentDataset": "tokenloom.datasets._packed",
    "PackedIndex": "tokenloom.datasets._packing_plan",
    "PackedSFTDataset": "tokenloom.datasets._packed_sft",
    "Packing": "tokenloom.datasets._packing_mode",
    "PackingAlgorithm": "tokenloom.datasets._binpack",
    "PackingPlan": "tokenloom.datasets._packing_plan",
    "PrefetchFromSampler": "tokenloom.datasets._prefetch",
    "SampleBatch": "tokenloom.datasets._batch",
    "SamplerCheckpoint": "tokenloom.datasets._checkpoint",
    "SampleRow": "tokenloom.datasets._batch",
    "WindowBatch": "tokenloom.datasets._batch",
    "stack_samples": "tokenloom.datasets._batch",
    "windows_to_sample": "tokenloom.datasets._batch",
    "MaskAlignment": "tokenloom.datasets._keyed",
    "RecordDataset": "tokenloom.datasets._records",
    "ResumableSamplerCallback": "tokenloom.datasets._trainer",
    "TrainType": "tokenloom.datasets._keyed",
    "best_fit_decreasing": "tokenloom.datasets._binpack",
    "build_batch": "tokenloom.datasets._sample",
    "build_sample": "tokenloom.datasets._sample",
    "check_state": "tokenloom.datasets._state",
    "data_objects": "tokenloom.datasets._state",
    "with_objects": "tokenloom.datasets._state",
    "collate": "tokenloom.datasets._batch",
    "compute_plan": "tokenloom.datasets._packing_plan",
    "data_fingerprint": "tokenloom.datasets._state",
    "documents_with_eos": "tokenloom.datasets._eos",
    "interleave": "tokenloom.datasets._mixture",
    "length_binned_greedy": "tokenloom.datasets._binpack",
    "pack_order": "tokenloom.datasets._binpack",
    "resolve_eos_id": "tokenloom.datasets._eos",
    "settings_fingerprint": "tokenloom.datasets._state",
    "to_torch": "tokenloom.datasets._sample",
    "tokenizer_fingerprint": "tokenloom.datasets._hf",
    "validate_weights": "tokenloom.datasets._mixture",
    "WindowIndex": "tokenloom.datasets._window_index",
    "use_resumable_sampler": "tokenloom.datasets._trainer",
}

__all__ = [
    "IGNORE_INDEX",
    "ArrayStore",
    "DatasetFactory",
    "HuggingFaceDataset",
    "KeyedDataset",
    "KeyedSource",
    "MemoryMappedDataset",
    "MixtureDataset",
    "PackedDocumentDataset",
    "PackedIndex",
    "PackedSFTDataset",
    "Packing",
    "PackingAlgorithm",
    "PackingPlan",
    "PrefetchFromSampler",
    "SampleBatch",
    "SamplerCheckpoint",
    "SampleRow",
    "MaskAlignment",
    "RecordDataset",
    "ResumableSamplerCallback",
    "TrainType",
    "WindowBatch",
    "WindowIndex",
    "best_fit_decreasing",
    "build_batch",
    "build_sample",
    "check_state",
    "collate",
    "compute_plan",
    "data_fingerprint",
    "data_objects",
    "documents_with_eos",
    "interleave",
    "length_binned_greedy",
    "pack_order",
    "resolve_eos_id",
    "settings_fingerprint",
    "stack_samples",
    "to_torch",
    "tokenizer_fingerprint",
    "use_resumable_sampler",
    "validate_weights",
    "windows_to_sample",
    "with_objects",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)
