"""Mapped cache blocks (no fd held, unmapped with their last view) against what outlives them: views of views,
torch tensors, pickles and eviction under a tight cache limit, reference cycles with finalizers, fork."""

from __future__ import annotations

import ast
import gc
import pickle
import subprocess
import sys
import textwrap
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tokenloom.formats import RemoteOptions, open_dataset, open_writer

BLOCK = 4096


def _mapped_blocks(cache: Path) -> int:
    """Maps of this process onto cached block files (unlinked ones included)."""
    text = Path("/proc/self/maps").read_text()
    return sum(1 for line in text.splitlines() if str(cache) in line and f"/b{BLOCK}-" in line)


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> Path:
    rng = np.random.default_rng(5)
    root = tmp_path_factory.mktemp("lifetime") / "ds"
    with open_writer(root, format="native", dtype="uint16", vocab_size=50_000, eos_id=0) as w:
        for _ in range(80):
            w.add(np.append(rng.integers(1, 50_000, size=700, dtype=np.uint16), np.uint16(0)))
    return root  # 112 KB of tokens: 28 blocks of 4 KiB


def test_views_outlive_eviction_under_a_tight_limit_and_are_unmapped_after(seaweed, local, tmp_path):
    url = seaweed.upload_dir(local, f"life-{uuid.uuid4().hex[:8]}")
    expected = open_dataset(local)
    cache = tmp_path / "cache"
    ds = open_dataset(
        url,
        remote=RemoteOptions.from_keywords(
            storage_options=seaweed.storage_options(),
            block_cache_dir=cache,
            block_size=BLOCK,
            cache_limit=6 * BLOCK + 64 * 1024,
        ),
    )
    doc = sliced = halves = raw = None  # bound even if no loop ran: the del below drops the last views
    kept = []
    for i in range(len(ds)):
        doc = np.asarray(ds[i])
        kept.append((i, doc[1:-1][::2], doc[: len(doc) // 2].view(np.int16)[::3], doc.data[3:]))
        if i % 10 == 0:
            gc.collect()
    blocks = sum(-(-p.stat().st_size // BLOCK) for p in local.glob("*.bin"))
    cached = sum(1 for p in cache.rglob(f"b{BLOCK}-*") if "." not in p.name)
    assert cached < blocks  # blocks were evicted while views of them lived
    del ds
    gc.collect()
    for i, sliced, halves, raw in kept:  # every view still reads its bytes, its block long evicted and unmapped
        want = np.asarray(expected[i])
        assert np.array_equal(sliced, want[1:-1][::2])
        assert np.array_equal(halves, want[: len(want) // 2].view(np.int16)[::3])
        assert np.array_equal(np.asarray(raw), want[3:])
        assert np.array_equal(pickle.loads(pickle.dumps(sliced)), want[1:-1][::2])
    assert _mapped_blocks(cache) > 0
    del doc, sliced, halves, raw, kept
    gc.collect()
    assert _mapped_blocks(cache) == 0  # the last view gone: nothing stays mapped


_CYCLE = textwrap.dedent(
    """
    import gc, sys
    from pathlib import Path
    from tokenloom.formats.remote.cache import _map_inode

    path = Path(sys.argv[1])
    seen = []

    class Holder:  # a finalizer that reads the block, in a cycle with the block's only view
        def __del__(self):
            seen.append(bytes(self.view[:4]))

    def reader(view):  # a generator's finally runs when the collector closes it
        try:
            yield
        finally:
            seen.append(bytes(view[-4:]))

    holder = Holder()
    holder.me, holder.view = holder, _map_inode(path, path.stat().st_size)[0]
    holder.gen = reader(holder.view)
    next(holder.gen)
    del holder
    gc.collect()
    print(seen)
    """
)


def test_a_view_in_a_reference_cycle_is_unmapped_after_the_cycles_finalizers_read_it(tmp_path):
    """The collector ran the unmap (a weakref callback on the tracked ctypes pages) before the cycle's
    finalizers: a ``__del__`` or a generator's ``finally`` reading the block crashed the process (SIGSEGV)."""
    block = tmp_path / f"b{BLOCK}-0"
    block.write_bytes(b"head" + bytes(BLOCK - 8) + b"tail")
    run = subprocess.run(
        [sys.executable, "-X", "dev", "-c", _CYCLE, str(block)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert sorted(ast.literal_eval(run.stdout)) == [b"head", b"tail"]


def test_an_unbounded_cache_keeps_only_its_resident_maps_mapped(seaweed, local, tmp_path, monkeypatch):
    """Each map is one of the kernel's ``vm.max_map_count`` (65,530) per process: an unbounded cache that kept
    every block it read mapped (in the cache and as typed views in each array) failed with ENOMEM, named as a
    path/permissions/free-space problem, after ~65,000 blocks. 4 resident maps here stand for the 4,096."""
    from tokenloom.formats.remote import BlockCache
    from tokenloom.formats.remote import array as array_module

    monkeypatch.setattr(BlockCache, "resident_maps", 4, raising=False)
    url = seaweed.upload_dir(local, f"resident-{uuid.uuid4().hex[:8]}")
    expected = open_dataset(local)
    want = [np.asarray(expected[i]).tobytes() for i in range(len(expected))]
    cache = tmp_path / "cache"
    ds = open_dataset(
        url,
        remote=RemoteOptions.from_keywords(
            storage_options=seaweed.storage_options(), block_cache_dir=cache, block_size=BLOCK
        ),
    )
    blocks = sum(-(-p.stat().st_size // BLOCK) for p in local.glob("*.bin"))
    shards = len(list(local.glob("*.bin")))
    for _ in range(2):  # the second pass maps evicted blocks again
        assert [np.asarray(ds[i]).tobytes() for i in range(len(ds))] == want
        gc.collect()
        assert _mapped_blocks(cache) <= 4 + getattr(array_module, "_TYPED_BLOCKS", 8) * shards < blocks

    def read(seed: int) -> bool:  # threads sharing the dataset trim the same maps and typed blocks
        order = np.random.default_rng(seed).integers(0, len(ds), size=400)
        return all(np.asarray(ds[int(i)]).tobytes() == want[int(i)] for i in order)

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(read, range(8)))
    gc.collect()
    assert _mapped_blocks(cache) <= 4 + 4 + getattr(array_module, "_TYPED_BLOCKS", 8) * shards  # (+ a race's)
