"""A GPT-Simple data directory (no manifest) trains through the datasets unchanged.

The shards are built byte by byte from GPT-Simple's documented .idx layout
(b"GPTS", uint32 version 1, uint32 dtype code 2, uint32 count, int64 offsets,
uint16 overlaps); the real gpt-simple-lm is exercised in integration-tests.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from tokenloom.datasets import IGNORE_INDEX, MemoryMappedDataset, PackedDocumentDataset
from tokenloom.formats import open_buckets

EOD = 0
# a document cut into two windows (the second repeats 2 tokens: overlap 2), then a short one
WINDOWS = [([5, 6, 7, 8], 0), ([7, 8, 9, EOD], 2), ([3, 4, EOD], 0)]


def gpt_simple_bucket(root: Path) -> Path:
    root.mkdir(parents=True)
    tokens = np.concatenate([np.array(w, np.uint16) for w, _ in WINDOWS])
    offsets = np.concatenate([[0], np.cumsum([len(w) for w, _ in WINDOWS])]).astype(np.int64)
    overlaps = np.array([o for _, o in WINDOWS], np.uint16)
    (root / "00000.bin").write_bytes(tokens.tobytes())
    header = b"GPTS" + struct.pack("<III", 1, 2, len(WINDOWS))
    (root / "00000.idx").write_bytes(header + offsets.tobytes() + overlaps.tobytes())
    return root


def test_windows_and_packing_over_a_gpt_simple_bucket(tmp_path: Path) -> None:
    bucket = gpt_simple_bucket(tmp_path / "tokenized" / "train" / "web")
    assert list(open_buckets(tmp_path / "tokenized")) == ["web"]
    windows = MemoryMappedDataset(bucket, seq_len=3, pack_sequences="gpt-simple", eos_id=EOD)
    assert len(windows) == 2  # 11 tokens // 4
    assert windows[0]["input_ids"].tolist() == [5, 6, 7]
    packed = PackedDocumentDataset(bucket, seq_len=4, pad_id=EOD, plan_cache_dir=tmp_path / "plans")
    samples = [packed[i] for i in range(len(packed))]
    by_first = {tuple(s["input_ids"].tolist()): s["labels"].tolist() for s in samples}
    # the repeated window's overlap prefix (7, 8) is not trained on a second time
    second = next(labels for ids, labels in by_first.items() if ids[:2] == (7, 8))
    assert second[:1] == [IGNORE_INDEX] and second[1:3] == [9, EOD]
