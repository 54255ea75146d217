"""tokenloom.hf_streaming: Hugging Face streaming datasets to packed batches, resumable exactly and elastically.

    source shards (files, parquet row groups, jsonl byte ranges, HF shards)
        -> dealt to rank x worker slots (unit order keyed by (seed, epoch))
        -> block shuffle inside each shard, keyed by (seed, epoch, shard, block)
        -> batched encode (+ EOS) -> concatenated, cut into seq_len + 1 windows -> sample dicts
        -> state per slot = (epoch, shard cursor, row, token offset): JSON, rebuildable, mergeable

Example::

    from tokenloom.hf_streaming import StreamingHuggingFaceDataset, merge_rank_states, stream_loader

    ds = StreamingHuggingFaceDataset("json", "train", "text", seq_len=2048, tokenizer_path="tok/",
                                     data_files=["a.jsonl", "b.jsonl.gz"], seed=7, with_provenance=True)
    loader = stream_loader(ds, batch_size=8, num_workers=2)  # a StatefulDataLoader; workers cut the batches
    # same topology: loader.load_state_dict(saved_state_of_this_rank)
    # any topology: ds.load_state_dict(merge_rank_states(all_ranks_saved_loader_states))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenloom.formats.io import lazy_exports

if TYPE_CHECKING:
    from tokenloom.hf_streaming._dataset import StreamingHuggingFaceDataset
    from tokenloom.hf_streaming._encode import EncodeFn, engine_encoder, hf_encoder, resolve_tokenizer
    from tokenloom.hf_streaming._finite import FiniteStepper, padding_batch
    from tokenloom.hf_streaming._loader import stream_loader
    from tokenloom.hf_streaming._resume import Mode
    from tokenloom.hf_streaming._state import load_rank_states, merge_rank_states, save_rank_state, slot_states_in

#: Public name -> the module that defines it, imported on first use: ``import tokenloom.hf_streaming`` (and every
#: ``tokenloom ... --help``) costs no torch until something that needs it is asked for.
_EXPORTS = {
    "EncodeFn": "tokenloom.hf_streaming._encode",
    "FiniteStepper": "tokenloom.hf_streaming._finite",
    "Mode": "tokenloom.hf_streaming._resume",
    "StreamingHuggingFaceDataset": "tokenloom.hf_streaming._dataset",
    "engine_encoder": "tokenloom.hf_streaming._encode",
    "hf_encoder": "tokenloom.hf_streaming._encode",
    "load_rank_states": "tokenloom.hf_streaming._state",
    "merge_rank_states": "tokenloom.hf_streaming._state",
    "padding_batch": "tokenloom.hf_streaming._finite",
    "resolve_tokenizer": "tokenloom.hf_streaming._encode",
    "save_rank_state": "tokenloom.hf_streaming._state",
    "slot_states_in": "tokenloom.hf_streaming._state",
    "stream_loader": "tokenloom.hf_streaming._loader",
}

__all__ = [
    "EncodeFn",
    "FiniteStepper",
    "Mode",
    "StreamingHuggingFaceDataset",
    "engine_encoder",
    "hf_encoder",
    "load_rank_states",
    "merge_rank_states",
    "padding_batch",
    "resolve_tokenizer",
    "save_rank_state",
    "slot_states_in",
    "stream_loader",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)
