"""A receiving rank holds the result and nothing more than two chunks beside it (VmHWM, real processes)."""

from __future__ import annotations

import sys

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads VmHWM from /proc/self/status (Linux)")


@pytest.mark.parametrize(("num_tokens", "chunk_bytes"), [(100_000_000, 4 << 20)])
def test_chunked_transfer_peak_memory_of_a_receiver(run_ranks, num_tokens, chunk_bytes):
    results = run_ranks(2, "memory", {"num_tokens": num_tokens, "chunk_bytes": chunk_bytes}, timeout=300)
    source, receiver = results
    assert "crash" not in source and "crash" not in receiver, (source, receiver)
    assert receiver["origin"] == "received" and receiver["sha256"] == source["sha256"]
    assert receiver["dtype"] == "torch.uint16"  # 2 bytes a token on the wire, not the seed's 8
    full_rows = num_tokens // 2048
    assert receiver["result_bytes"] == (full_rows + 1) * 2048 * 2
    grown = (receiver["peak_kib"] - receiver["before_kib"]) * 1024
    # the meter sees the received tensor (so it would see a staging copy too) ...
    assert grown >= 0.95 * receiver["result_bytes"]
    # ... and nothing beside it beyond two chunks
    assert grown - receiver["result_bytes"] <= 2 * chunk_bytes, (grown, receiver)
