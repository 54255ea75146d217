"""Datasets in object storage: ``s3://``, ``gs://``, ``az://``, ``https://`` (extra ``remote``, client obstore).

    ds = open_dataset("s3://bucket/ds", storage_options={"endpoint": ...}, cache_dir="/local/nvme/cache")
    ds.remote   # the RemoteOptions it was opened with (endpoint, credentials, block cache, retry budget)

``options`` holds :class:`RemoteOptions`, the one value that says how to reach a store and cache it (carried
and pickled with a dataset); ``client`` builds stores per process and does ranged GETs
with If-Match, retries and named errors, ``cache`` keeps aligned blocks per node (temp file + rename
under a lock, read back by memory map), ``array`` serves a shard's tokens from those blocks,
``blockfile`` a file object over them, ``opener`` the one open path (manifest, listing, identity) and
``source`` the local view a format's own reader runs on, unless its ``FormatSpec.remote`` opens it off the
manifest (``native``: an index is fetched when its shard is first touched). ``budget`` keeps the cache
under ``cache_limit`` (Belady eviction) and ``prefetch``
fetches the blocks of a reader's next samples in a background thread. URLs are recognised in
``tokenloom.formats.io.urls``. Writes (``publish``: staged locally, shards uploaded as committed, the
manifest last; ``convert_output`` for ``convert``) go through the helper's ``put``; outputs still not
supported are refused by :func:`refuse_remote_output`. Test servers live in ``tokenloom-testing``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from tokenloom.formats._contract import Validate, as_validate
from tokenloom.formats._dataset import TokenDataset
from tokenloom.formats.io.urls import REMOTE_SCHEMES, RemoteURL, is_remote_url, parse_url, refuse_remote_output
from tokenloom.formats.remote.array import BlockArray
from tokenloom.formats.remote.cache import BlockCache, default_cache_dir
from tokenloom.formats.remote.client import ObjectInfo, RetryPolicy, StoreConfig
from tokenloom.formats.remote.options import DEFAULT_BLOCK_SIZE, RemoteOptions

if TYPE_CHECKING:
    from tokenloom.formats.remote.opener import FormatTable

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "REMOTE_SCHEMES",
    "BlockArray",
    "BlockCache",
    "ObjectInfo",
    "RemoteOptions",
    "RemoteURL",
    "RetryPolicy",
    "StoreConfig",
    "default_cache_dir",
    "is_remote_url",
    "open_remote",
    "parse_url",
    "refuse_remote_output",
]


def open_remote(
    url: str | os.PathLike[str],
    *,
    format: str | None = None,
    dtype: Any = None,
    validate: Validate | str = Validate.FAST,
    remote: RemoteOptions | None = None,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    block_size: int | None = None,
    retries: RetryPolicy | int | None = None,
    cache_limit: int | str | None = None,
    formats: FormatTable,
    **options: Any,
) -> TokenDataset:
    """Open the dataset at ``url`` through the per-node block cache, in any format (``options``: the reader's).

    ``remote`` (a :class:`RemoteOptions`) says how; the keywords are the user's spelling of its fields
    (``storage_options``: obstore's settings, endpoint and credentials included; ``cache_dir``: the block
    cache) and win over it. ``cache_limit`` (bytes or ``"20GB"``; default ``$TOKENLOOM_CACHE_LIMIT``, else
    unbounded) bounds the cache directory: blocks are evicted by their next use in the readers' known future
    (Belady). ``block_size`` (bytes, a multiple of 4096) defaults to ``$TOKENLOOM_BLOCK_SIZE``, else 8 MiB.
    The dataset returned carries the options as ``dataset.remote``.
    """
    from tokenloom.formats.remote.opener import open_remote_any

    # ``formats``: the registry's lookups (``tokenloom.formats.open_dataset`` passes them; call that instead)
    settings = RemoteOptions.from_keywords(
        storage_options=storage_options,
        cache_dir=cache_dir,
        block_size=block_size,
        retries=retries,
        cache_limit=cache_limit,
        remote=remote,
    )
    cache = BlockCache.of(settings.store(parse_url(url)), settings)
    dataset = open_remote_any(
        cache, format=format, dtype=dtype, validate=as_validate(validate), options=options, formats=formats
    )
    dataset.remote = settings
    return dataset
