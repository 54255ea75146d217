"""Datasets in object storage: ``s3://``, ``gs://``, ``az://``, ``https://`` (extra ``remote``, client obstore).

    ds = open_dataset("s3://bucket/ds", remote=RemoteOptions(endpoint=..., block_cache_dir="/local/nvme/cache"))
    ds.remote   # the RemoteOptions it was opened with (endpoint, credentials, block cache, retry budget)

``options`` holds :class:`RemoteOptions`, the one value that says how to reach a store and cache it (carried
and pickled with a dataset); ``client`` builds stores per process and does ranged GETs
with If-Match, retries and named errors, ``cache`` keeps aligned blocks per node (temp file + rename
under a lock, read back by memory map), ``array`` serves a shard's tokens from those blocks,
``blockfile`` a file object over them, ``opener`` the one open path (manifest, listing, identity) and
``source`` the :class:`RemotePath` a format's own reader runs on (the listing answers stat and glob, the
cache serves the bytes), unless its ``FormatSpec.remote`` opens it off the
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
from tokenloom.formats.errors import ConfigError
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
    formats: FormatTable,
    **options: Any,
) -> TokenDataset:
    """Open the dataset at ``url`` through the per-node block cache, in any format (``options``: the reader's).

    ``remote`` (a :class:`RemoteOptions`; None: the environment's store settings and cache) says how: the
    endpoint and credentials, ``block_cache_dir``, ``cache_limit`` (blocks are evicted by their next use in the
    readers' known future), ``block_size`` and the retry budget. The dataset returned carries it as
    ``dataset.remote``.
    """
    from tokenloom.formats.remote.opener import open_remote_any, refuse_unknown

    refuse_unknown(options, formats)  # storage_options=, cache_dir= (a URL's settings are remote=) or a typo
    if remote is not None and not isinstance(remote, RemoteOptions):
        raise ConfigError(
            f"remote={remote!r:.80} is not a RemoteOptions",
            field="remote",
            hint="Pass remote=RemoteOptions(endpoint=..., block_cache_dir=...); a settings dict is "
            "remote=RemoteOptions.from_keywords(storage_options={...}, block_cache_dir=...)",
        )
    # ``formats``: the registry's lookups (``tokenloom.formats.open_dataset`` passes them; call that instead)
    settings = remote if remote is not None else RemoteOptions()
    cache = BlockCache.of(settings.store(parse_url(url)), settings)
    dataset = open_remote_any(
        cache, format=format, dtype=dtype, validate=as_validate(validate), options=options, formats=formats
    )
    dataset.remote = settings
    return dataset
