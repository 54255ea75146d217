"""Helpers the datasets test modules share (imported by name: conftest.py puts this folder on sys.path)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path


def cache_bytes(root: Path) -> int:
    """Bytes of the files in the cache, counted under its node-wide lock.

    A walk over several folders is no snapshot while readers evict in one and fill another (it would
    count a block's bytes twice); under the lock files only change size inside their reservations.
    """
    from tokenloom.formats.remote.budget import node_lock  # its fd is never inherited by a forked worker

    with node_lock(root):
        folders = (folder for folder in os.walk(root) if Path(folder[0]).name != "readers")
        return sum(_size(Path(folder, name)) for folder, _, names in folders for name in names)


def _size(path: Path) -> int:
    """The file's size; 0 if it is gone (evicted while the cache is walked)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


@contextlib.contextmanager
def cache_peak(cache: Path, every: float) -> Iterator[list[int]]:
    """Watch the cache's size every ``every`` seconds in a thread while the block runs: ``[the largest seen]``."""
    peak, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], cache_bytes(cache))
            time.sleep(every)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield peak
    finally:
        stop.set()
        watcher.join()


def init_gloo(init_method: str, rank: int, world_size: int) -> None:
    """This process joins a gloo process group as ``rank`` of ``world_size`` (60 s to meet the others)."""
    import datetime

    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=60)
    )


def write_random_docs(root: Path, num_tokens: int, *, seed: int, vocab_size: int, max_length: int) -> Path:
    """A native dataset of exactly ``num_tokens`` tokens: random documents of 4..max_length tokens ending in EOS 0."""
    import numpy as np

    from tokenloom.formats import open_writer

    rng = np.random.default_rng(seed)
    remaining = num_tokens
    with open_writer(root, dtype="uint16", vocab_size=vocab_size, eos_id=0) as writer:
        while remaining:
            length = min(remaining, int(rng.integers(4, max_length)))
            writer.add(np.append(rng.integers(1, vocab_size, size=length - 1), 0))
            remaining -= length
    return root
