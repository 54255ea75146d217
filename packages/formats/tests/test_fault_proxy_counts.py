"""FaultProxy's benchmark knobs: a latency on every request and GET body bytes per path, against real SeaweedFS."""

from __future__ import annotations

import time
import uuid

import obstore
from obstore.store import S3Store


def test_latency_delays_every_request_and_get_bytes_counts_bodies(seaweed, fault_proxy):
    key = f"counts-{uuid.uuid4().hex[:8]}/blob"
    seaweed.put(key, b"x" * 10_000)
    store = S3Store(seaweed.bucket, **seaweed.storage_options(endpoint=fault_proxy.url))  # pyright: ignore[reportArgumentType]
    assert bytes(obstore.get(store, key).bytes()) == b"x" * 10_000
    assert bytes(obstore.get_range(store, key, start=100, end=1_100)) == b"x" * 1_000
    path = f"/{seaweed.bucket}/{key}"
    assert fault_proxy.gets[path] == 2
    assert fault_proxy.get_bytes[path] == 11_000

    fault_proxy.latency_seconds = 0.3
    started = time.perf_counter()
    obstore.head(store, key)  # not a GET: delayed all the same, and not counted
    obstore.get_range(store, key, start=0, end=10)
    assert time.perf_counter() - started >= 0.6
    assert fault_proxy.get_bytes[path] == 11_010 and fault_proxy.gets[path] == 3
