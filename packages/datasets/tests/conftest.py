from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from tokenloom.formats import open_dataset, open_writer

sys.path.insert(0, str(Path(__file__).parent))  # the tests' shared helpers: datasets_helpers
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def write_native(
    path: Path,
    docs: Sequence[Sequence[int]],
    *,
    eos_id: int | None = 0,
    overlaps: Sequence[int] | None = None,
    shard_size_tokens: int | None = None,
    dtype: str = "uint16",
):
    """A native dataset of ``docs`` (entries), opened."""
    with open_writer(path, dtype=dtype, eos_id=eos_id, vocab_size=1000, shard_size_tokens=shard_size_tokens) as writer:
        for i, doc in enumerate(docs):
            writer.add(np.asarray(doc, dtype=np.int64), overlap_prefix=0 if overlaps is None else overlaps[i])
    return open_dataset(path)


@pytest.fixture
def native(tmp_path):
    counter = iter(range(1000))

    def make(docs, **kwargs):
        return write_native(tmp_path / f"ds{next(counter)}", docs, **kwargs)

    return make
