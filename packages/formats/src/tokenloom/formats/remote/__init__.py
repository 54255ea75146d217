"""Datasets in object storage: ``s3://``, ``gs://``, ``az://``, ``https://`` (extra ``remote``, client obstore).

    ds = open_dataset("s3://bucket/ds", remote=RemoteOptions(endpoint=..., block_cache_dir="/local/nvme/cache"))
    # RemoteOptions and open_dataset: from tokenloom.formats
    ds.remote   # the RemoteOptions it was opened with (endpoint, credentials, block cache, retry budget)

``options`` holds :class:`RemoteOptions`, the one value that says how to reach a store and cache it (carried
and pickled with a dataset); ``client`` builds stores per process and does ranged GETs
with If-Match, retries and named errors, ``cache`` keeps aligned blocks per node (temp file + rename
under a lock, read back by memory map), ``array`` serves a shard's tokens from those blocks,
``blockfile`` a file object over them, ``opener`` the one open path (manifest, listing, identity) and
``source`` the :class:`RemotePath` every format's own reader runs on (the listing answers stat and glob, the
cache serves the bytes by blocks: native's ``.idx`` is fetched block by block as its shards are touched, so a
10^9-document dataset opens off its manifest alone). ``budget`` keeps the cache
under ``cache_limit`` (Belady eviction) and ``prefetch``
fetches the blocks of a reader's next samples in a background thread. URLs are recognised in
``tokenloom.formats.io.urls``. Writes (``publish``: staged locally, shards uploaded as committed, the
manifest last; ``convert_output`` for ``convert``) go through the helper's ``put``; outputs still not
supported are refused by :func:`refuse_remote_output`. Test servers live in ``tokenloom-testing``.
"""

from __future__ import annotations

from tokenloom.formats.remote.cache import BlockCache
from tokenloom.formats.remote.client import RetryPolicy, StoreConfig
from tokenloom.formats.remote.opener import open_remote

__all__ = ["BlockCache", "RetryPolicy", "StoreConfig", "open_remote"]
