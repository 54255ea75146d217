"""What a reader needs in every DataLoader worker: the token files, not the per-entry index.

A dataset of 10^7 documents carries 10^8 bytes of offsets and overlap lengths.
The window and packed datasets read tokens by global position, so each keeps a
*token stream* (the same memory-mapped files, one entry per shard) for reading,
and the full dataset only where it was handed in, reopened on demand after
pickling. A worker then holds nothing that grows with the data: its pickle is
a few hundred bytes and its memory stays flat from 1 GB to 20 GB of shards.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tokenloom.formats import ConfigError, Shard, TokenDataset, open_dataset

__all__ = ["reopen", "select_shards", "token_stream"]


def token_stream(dataset: TokenDataset) -> TokenDataset:
    """The same tokens (same files, no copy) with one entry per shard and no per-document index."""
    shards = [_stream_shard(shard) for shard in dataset.shards]
    return TokenDataset(
        shards,
        format=dataset.format,
        root=dataset.root,
        eos_id=dataset.eos_id,
        vocab_size=dataset.vocab_size,
        fingerprint=dataset.fingerprint,
        tokenizer_fingerprint=dataset.tokenizer_fingerprint,
    )


def _stream_shard(shard: Shard) -> Shard:
    whole = Shard(
        tokens_path=shard.tokens_path,
        dtype=shard.dtype,
        num_tokens=shard.num_tokens,
        offsets=np.array([0, shard.num_tokens], dtype=np.int64),
        overlap_prefix=np.zeros(1, dtype=np.uint16),
        tokens_offset=shard.tokens_offset,
        name=shard.name,
    )
    array = getattr(shard, "array", None)
    if array is None:
        return whole
    # a remote shard: its tokens come from the block cache, not a local memory map
    remote = type(shard)(**{name: getattr(whole, name) for name in whole.__dataclass_fields__})
    remote.array = array  # pyright: ignore[reportAttributeAccessIssue]
    return remote


def select_shards(
    dataset: TokenDataset, *, pattern: str | None = None, names: Sequence[str] | None = None
) -> TokenDataset:
    """The shards whose data file matches ``pattern`` (sorted by file name), or those named ``names``."""
    if pattern is not None:
        shards = sorted(
            (s for s in dataset.shards if fnmatch.fnmatch(s.tokens_path.name, pattern)),
            key=lambda s: s.tokens_path.name,
        )
        wanted = f"file_pattern {pattern!r}"
    else:
        by_name = {s.name: s for s in dataset.shards}
        shards = [by_name[name] for name in names or () if name in by_name]
        if len(shards) != len(names or ()):
            shards = []
        wanted = f"shards {list(names or ())}"
    if not shards:
        raise ConfigError(
            f"{wanted} matches none of {[s.tokens_path.name for s in dataset.shards]}",
            path=dataset.root,
            field="file_pattern",
        )
    if names is not None and len(shards) == len(dataset.shards):
        return dataset
    return TokenDataset(
        shards,
        format=dataset.format,
        root=dataset.root,
        eos_id=dataset.eos_id,
        vocab_size=dataset.vocab_size,
        fingerprint=None,
        tokenizer_fingerprint=dataset.tokenizer_fingerprint,
        metadata=dataset.metadata,
    )


def reopen(root: str | os.PathLike[str] | Path, shard_names: Sequence[str]) -> TokenDataset:
    """The dataset at ``root`` restricted to ``shard_names`` (after pickling, where the index was dropped)."""
    return select_shards(open_dataset(root), names=shard_names)
