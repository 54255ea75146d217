"""Windows and packing over a 10^7-entry dataset: construction maps the index, it does not copy it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from tokenloom.formats.native.layout import HEADER, idx_size, pack_header

N = 10**7
TOKENS = 1 << 16


def _native(root: Path, n: int, *, overlap_at: int | None = None) -> Path:
    """n entries, every one empty but the last (a hole of TOKENS tokens); optionally one overlap prefix."""
    root.mkdir()
    with open(root / "shard.idx", "wb") as handle:
        handle.truncate(idx_size(n))
        handle.write(pack_header(np.dtype("uint16"), n))
        handle.seek(HEADER.size + 8 * n)
        handle.write(np.array([TOKENS], "<i8").tobytes())
        if overlap_at is not None:
            handle.seek(HEADER.size + 8 * (n + 1) + 2 * overlap_at)
            handle.write(np.array([3], "<u2").tobytes())
    with open(root / "shard.bin", "wb") as handle:
        handle.truncate(2 * TOKENS)
    return root


_CHILD = r"""
import json, sys
from tokenloom.datasets import MemoryMappedDataset

def rss():
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) << 10 for line in handle if line.startswith("VmRSS"))

MemoryMappedDataset(sys.argv[2], seq_len=127)[0]  # imports warm
with open("/proc/self/clear_refs", "w") as handle:
    handle.write("5")
before = rss()
dataset = MemoryMappedDataset(sys.argv[1], seq_len=127)
sample = dataset[0]  # its first tokens are the overlap prefix: masked
after = rss()
with open("/proc/self/status") as handle:
    peak = next(int(line.split()[1]) << 10 for line in handle if line.startswith("VmHWM"))
print(json.dumps({"rss": after - before, "peak": peak - before, "samples": len(dataset),
                  "ignored": int((sample["labels"] == -100).sum())}))
"""


def test_windows_over_a_huge_index_grow_rss_by_less_than_50_mb(tmp_path: Path) -> None:
    big = _native(tmp_path / "big", N, overlap_at=N - 1)  # the last entry repeats 3 tokens: masked
    small = _native(tmp_path / "small", 1000)
    env = {**os.environ, "TOKENLOOM_CACHE_DIR": str(tmp_path / "cache")}
    ran = subprocess.run(
        [sys.executable, "-c", _CHILD, str(big), str(small)], capture_output=True, text=True, timeout=300, env=env
    )
    assert ran.returncode == 0, ran.stderr
    result = json.loads(ran.stdout.strip().splitlines()[-1])
    assert result["samples"] == TOKENS // 128 and result["ignored"] > 0
    assert result["rss"] < 50 << 20 and result["peak"] < 50 << 20, result
