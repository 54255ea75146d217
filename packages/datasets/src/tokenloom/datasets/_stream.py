"""What a reader needs in every DataLoader worker: the token files, not the per-entry index.

A dataset of 10^7 documents carries 10^8 bytes of offsets and overlap lengths.
The window and packed datasets read tokens by global position, so each keeps a
*token stream* (the same memory-mapped files, one entry per shard) for reading,
and the full dataset only where it was handed in, reopened on demand after
pickling. A worker then holds nothing that grows with the data: its pickle is
a few hundred bytes and its memory stays flat from 1 GB to 20 GB of shards.

Data in object storage (``s3://``, ``gs://``, ``az://``, ``https://``) keeps its URL as the root (never a
local ``Path``) and its shards' block-cache readers; a reopen after pickling uses the dataset's own
``RemoteOptions`` (``dataset.remote``: endpoint, credentials, block cache and its limit, retry budget).
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Sequence
from pathlib import Path

from tokenloom.formats import ConfigError, RemoteOptions, Shard, TokenDataset, open_dataset
from tokenloom.formats.io import is_remote_url

__all__ = ["check_remote", "open_data", "reopen", "select_shards", "token_stream"]


def check_remote(
    data: object, remote: RemoteOptions | None, *, in_hand: str = "an open dataset", option: str = "remote"
) -> None:
    """ConfigError when ``remote`` is given for anything but a URL (``in_hand``: what an object passed is called;
    ``option``: what the user passed)."""
    if remote is None or (isinstance(data, str | os.PathLike) and is_remote_url(data)):
        return
    what = f"the local path {os.fspath(data)!r}" if isinstance(data, str | os.PathLike) else in_hand
    raise ConfigError(
        f"{option} applies to data in object storage (s3://, gs://, az://, https://), not to {what}",
        field="remote",
        hint="Drop the option, or pass the data's URL",
    )


def open_data(data: str | os.PathLike[str] | TokenDataset, *, remote: RemoteOptions | None = None) -> TokenDataset:
    """``data`` opened (a path or a URL), or as is (an open dataset); ``remote`` (how a URL is read: store,
    credentials, block cache) only for a URL, carried by the dataset (``dataset.remote``)."""
    check_remote(data, remote)
    if isinstance(data, TokenDataset):
        return data
    return open_dataset(data, remote=remote)  # None for a local path (checked above)


def _derived(dataset: TokenDataset, shards: list[Shard], fingerprint: str | None, metadata: dict) -> TokenDataset:
    """A dataset over ``shards`` of ``dataset``, with its format, ids, root and remote options."""
    derived = TokenDataset(
        shards,
        format=dataset.format,
        root=dataset.root,
        eos_id=dataset.eos_id,
        vocab_size=dataset.vocab_size,
        fingerprint=fingerprint,
        tokenizer_fingerprint=dataset.tokenizer_fingerprint,
        metadata=metadata,
    )
    derived.root = dataset.root  # a URL stays a URL (TokenDataset makes a Path of it)
    derived.remote = dataset.remote
    return derived


def token_stream(dataset: TokenDataset) -> TokenDataset:
    """The same tokens (same files, no copy) with one entry per shard and no per-document index (a remote
    shard keeps its reader)."""
    metadata = {k: v for k, v in dataset.metadata.items() if k in ("remote", "remote_objects")}
    return _derived(dataset, [shard.as_single_entry() for shard in dataset.shards], dataset.fingerprint, metadata)


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
    return _derived(dataset, shards, None, dataset.metadata)


def reopen(
    root: str | os.PathLike[str] | Path, shard_names: Sequence[str], remote: RemoteOptions | None = None
) -> TokenDataset:
    """The dataset at ``root`` restricted to ``shard_names`` (after pickling, where the index was dropped).

    ``remote``: the ``RemoteOptions`` of the dataset first opened (``dataset.remote``; None for local data).
    """
    return select_shards(open_dataset(root, remote=remote if is_remote_url(root) else None), names=shard_names)
