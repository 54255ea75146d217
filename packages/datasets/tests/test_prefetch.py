"""Prefetch from the sampler's known future, over a real S3 server and real DataLoader workers."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from datasets_helpers import cache_bytes, cache_peak
from torch.utils.data import DataLoader

from tokenloom.datasets import MemoryMappedDataset, PackedDocumentDataset, collate
from tokenloom.datasets._byte_ranges import block_array
from tokenloom.datasets._prefetch import share_schedule
from tokenloom.formats import ConfigError, RemoteOptions, open_dataset, open_writer
from tokenloom.formats.io import parse_url
from tokenloom.sampler import ResumableDistributedSampler

BLOCK = 4096
SEQ = 255  # 512-byte windows: 8 per block


def _write(root: Path, *, tokens: int = 200_000) -> Path:
    rng = np.random.default_rng(3)
    with open_writer(root, format="native", dtype="uint16", vocab_size=50_000, eos_id=0, shard_size_tokens=70_000) as w:
        written = 0
        while written < tokens:
            doc = np.append(rng.integers(1, 50_000, size=int(rng.integers(20, 600)), dtype=np.uint16), np.uint16(0))
            w.add(doc)
            written += len(doc)
    return root


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> Path:
    return _write(tmp_path_factory.mktemp("prefetch") / "ds")


@pytest.fixture
def url(seaweed, local) -> str:
    return seaweed.upload_dir(local, f"ds-{uuid.uuid4().hex[:8]}")


def _remote(url, seaweed, cache: Path, endpoint: str | None = None, **options):
    storage = seaweed.storage_options(endpoint=endpoint)
    remote = RemoteOptions.from_keywords(storage_options=storage, block_cache_dir=cache, block_size=BLOCK, **options)
    return open_dataset(url, remote=remote)


def _batches(loader) -> list[np.ndarray]:
    return [batch["input_ids"].numpy().copy() for batch in loader]


def _bin_gets(proxy, url: str) -> int:
    prefix = parse_url(url).prefix
    return sum(count for path, count in proxy.gets.items() if prefix in path and path.endswith(".bin"))


# -- the mapping (torch-free half) ------------------------------------------------------------------


def test_byte_ranges_are_exactly_the_bytes_a_sample_reads(local):
    windows = MemoryMappedDataset(local, seq_len=SEQ, cross_shard=True)
    files = [(local / f"{s.name}.bin").read_bytes() for s in open_dataset(local).shards]
    for index in range(len(windows)):
        pieces = b"".join(files[k][a:b] for k, a, b in windows.byte_ranges(index))
        assert pieces == windows.window(index).tobytes()
        assert all(windows.data_object(k).endswith(".bin") for k, _, _ in windows.byte_ranges(index))
    assert any(len(windows.byte_ranges(i)) == 2 for i in range(len(windows)))  # windows across a shard end
    packed = PackedDocumentDataset(local, seq_len=SEQ + 1, plan_cache_dir=local.parent / "plans")
    for index in range(len(packed)):
        pieces = b"".join(files[k][a:b] for k, a, b in packed.byte_ranges(index))
        sample = packed[index]
        real = sample["input_ids"][sample["labels"] != -100].numpy()  # tokens that came from the data
        first, last = int(packed.plan.bin_offsets[index]), int(packed.plan.bin_offsets[index + 1])
        assert len(pieces) // 2 == int(packed.plan.length[first:last].sum())
        assert len(real) <= len(pieces) // 2


@pytest.mark.parametrize(("replicas", "workers", "batch"), [(1, 1, 4), (2, 3, 5), (3, 2, 1)])
def test_worker_schedules_together_are_the_ranks_stream(replicas, workers, batch):
    n = 97
    for rank in range(replicas):
        sampler = ResumableDistributedSampler(n, num_replicas=replicas, rank=rank, seed=5)
        expected = list(sampler)
        sampler = ResumableDistributedSampler(n, num_replicas=replicas, rank=rank, seed=5)
        shares = [
            list(share_schedule(sampler, n, consumed=0, remaining=len(sampler), batch_size=batch, worker=w,
                                num_workers=workers))
            for w in range(workers)
        ]  # fmt: skip
        dealt = []  # the DataLoader deals batch k to worker k mod workers
        cursors = [0] * workers
        for k in range(-(-len(expected) // batch)):
            w = k % workers
            dealt += shares[w][cursors[w] : cursors[w] + batch]
            cursors[w] += batch
        assert dealt == expected


# -- a DataLoader over S3 -------------------------------------------------------------------------


def test_loader_with_prefetch_and_a_small_limit_reads_like_local_under_the_limit(seaweed, url, local, tmp_path):
    on_disk = MemoryMappedDataset(local, seq_len=SEQ)
    local_sampler = ResumableDistributedSampler(on_disk, num_replicas=2, rank=1, seed=9)
    expected = _batches(DataLoader(on_disk, batch_size=4, sampler=local_sampler, collate_fn=collate))
    cache = tmp_path / "cache"
    _remote(url, seaweed, cache)  # index files first, to size the limit around them
    limit = cache_bytes(cache) + 2 * (6 + 16) * BLOCK
    ds = MemoryMappedDataset(_remote(url, seaweed, cache, cache_limit=limit), seq_len=SEQ)
    sampler = ResumableDistributedSampler(ds, num_replicas=2, rank=1, seed=9)
    ds.prefetch(sampler, batch_size=4, lookahead=8, num_workers=2)
    with cache_peak(cache, 0.002) as peak:
        got = _batches(DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2, collate_fn=collate))
    assert len(got) == len(expected) and all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
    data_bytes = sum(p.stat().st_size for p in local.glob("*.bin"))
    assert data_bytes > 2 * limit and 0 < peak[0] <= limit, (peak[0], limit)


def test_blocks_of_many_samples_equal_the_blocks_of_each(seaweed, url, tmp_path):
    remote = _remote(url, seaweed, tmp_path / "c")
    for ds in (MemoryMappedDataset(remote, seq_len=SEQ), MemoryMappedDataset(remote, seq_len=SEQ, cross_shard=True)):
        indices = np.random.default_rng(0).permutation(len(ds)).tolist()
        expected = [[(id(c), o.url, n) for c, o, n in ds._remote_blocks(i)] for i in indices]
        got = [[(id(c), o.url, n) for c, o, n in blocks] for blocks in ds.blocks_of(indices)]
        assert got == expected and all(expected)


def test_too_small_a_limit_for_the_lookahead_is_a_config_error_at_start(seaweed, url, tmp_path):
    ds = MemoryMappedDataset(_remote(url, seaweed, tmp_path / "c", cache_limit=8 * BLOCK), seq_len=SEQ)
    sampler = ResumableDistributedSampler(ds, num_replicas=1, rank=0)
    with pytest.raises(ConfigError, match=r"too small for the blocks in flight .* 2 reader\(s\)"):
        ds.prefetch(sampler, batch_size=4, lookahead=64, num_workers=2)
    ds.prefetch(sampler, batch_size=4, lookahead=64)  # workers unknown here: their first batch says it
    loader = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2, collate_fn=collate)
    with pytest.raises(ConfigError, match="too small for the blocks in flight"):
        next(iter(loader))


def test_a_refused_prefetch_leaves_the_dataset_reading_without_it(seaweed, url, local, tmp_path):
    ds = MemoryMappedDataset(_remote(url, seaweed, tmp_path / "c", cache_limit=64 * BLOCK), seq_len=SEQ)
    sampler = ResumableDistributedSampler(ds, num_replicas=1, rank=0, seed=3)
    with pytest.raises(ConfigError, match="too small for the blocks in flight"):
        ds.prefetch(sampler, batch_size=4, lookahead=len(ds), num_workers=2)
    here = MemoryMappedDataset(local, seq_len=SEQ)
    loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate)  # in order: batch k = 4k..4k+3
    for step, batch in enumerate(loader):  # no prefetcher, no refusal in the workers: plain reads
        expected = [np.asarray(here[i]["input_ids"]) for i in range(step * 4, step * 4 + 4)]
        assert np.array_equal(batch["input_ids"].numpy(), np.stack(expected))
        if step == 10:
            break


def test_prefetched_window_is_read_with_no_get_on_the_hot_path(seaweed, fault_proxy, url, local, tmp_path):
    ds = MemoryMappedDataset(_remote(url, seaweed, tmp_path / "c", endpoint=fault_proxy.url), seq_len=SEQ)
    sampler = ResumableDistributedSampler(ds, num_replicas=1, rank=0, seed=2)
    lookahead = len(ds)  # each worker's whole share fits in its window
    ds.prefetch(sampler, batch_size=4, lookahead=lookahead, num_workers=2)
    loader = iter(DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2, collate_fn=collate))
    first = [next(loader)["input_ids"].numpy().copy()]
    blocks = sum(-(-(local / f"{s.name}.bin").stat().st_size // BLOCK) for s in ds._stream.shards)
    seen, stable_since, deadline = -1, time.monotonic(), time.monotonic() + 60
    # until both workers' prefetchers are done: every block fetched (the whole data is in the window), or, if
    # some block is never asked for, no new GET for 1.5 s (a quiet spell alone ended it early under load)
    while (seen < blocks and time.monotonic() < deadline) or time.monotonic() - stable_since < 1.5:
        count = _bin_gets(fault_proxy, url)
        if count != seen:
            seen, stable_since = count, time.monotonic()
        time.sleep(0.05)
    before = _bin_gets(fault_proxy, url)
    rest = [batch["input_ids"].numpy().copy() for batch in loader]
    assert _bin_gets(fault_proxy, url) == before  # the pass over the window issued no GET
    assert before <= blocks  # one GET per block per node, whichever process asked first
    local_sampler = ResumableDistributedSampler(MemoryMappedDataset(local, seq_len=SEQ), num_replicas=1, rank=0, seed=2)
    expected = _batches(DataLoader(MemoryMappedDataset(local, seq_len=SEQ), batch_size=4, sampler=local_sampler))
    assert all(np.array_equal(a, b) for a, b in zip(first + rest, expected, strict=True))


class _Timed(MemoryMappedDataset):
    """Records when the reader asked for each sample (the worker writes one line per batch)."""

    log_path: Path

    def __getitems__(self, indices):
        with open(self.log_path, "a") as handle:
            handle.write(f"{time.time()!r} {' '.join(map(str, indices))}\n")
        return super().__getitems__(indices)


def _block_times(ds, cache_root: Path, indices) -> dict[int, float]:
    """Sample index -> when the last of its blocks was published in the cache (file mtime)."""
    times = {}
    for index in indices:
        latest = 0.0
        for shard, start, end in ds.byte_ranges(index):
            array = block_array(ds._stream.shards[shard])
            for number in range(start // BLOCK, (end - 1) // BLOCK + 1):
                path = cache_root / "v1" / array.cache.block_key(array.obj, number)
                latest = max(latest, path.stat().st_mtime)
        times[index] = latest
    return times


@pytest.mark.parametrize("prefetch", [True, False])
def test_a_200ms_stall_is_hidden_by_prefetch(seaweed, fault_proxy, url, tmp_path, prefetch):
    fault_proxy.stall_seconds = 0.2
    fault_proxy.faults = ["stall"] * 10_000  # every GET waits 200 ms
    cache = tmp_path / "c"
    ds = _Timed(_remote(url, seaweed, cache, endpoint=fault_proxy.url), seq_len=SEQ)
    ds.log_path = tmp_path / "asked.log"
    sampler = ResumableDistributedSampler(ds, num_replicas=1, rank=0, shuffle=False)
    lookahead = 32  # four blocks of windows
    if prefetch:
        ds.prefetch(sampler, batch_size=1, lookahead=lookahead, num_workers=1)
    loader = DataLoader(ds, batch_size=1, sampler=sampler, num_workers=1, collate_fn=collate)
    for step, _ in enumerate(loader):
        time.sleep(0.1)  # the training step: 8 windows (one block) take 0.8 s, a GET 0.2 s
        if step == 3 * lookahead:  # 8 blocks past the first lookahead
            break
    asked = {}
    for line in ds.log_path.read_text().splitlines():
        when, *indices = line.split()
        asked.update({int(i): float(when) for i in indices})
    published = _block_times(ds, cache.resolve(), asked)
    late = [i for i in sorted(asked) if i >= lookahead and published[i] > asked[i]]
    on_time = [i for i in sorted(asked) if i >= lookahead and published[i] <= asked[i]]
    if prefetch:
        assert not late, f"samples whose blocks arrived after the reader asked: {late}"
    else:
        # without prefetch, each block's first sample waits for its GET (8 windows per block)
        assert len(late) >= len(range(lookahead, 3 * lookahead)) // 8 - 1 and len(on_time) > 0


def test_a_reopen_after_pickling_keeps_the_cache_limit(seaweed, url, tmp_path):
    """A worker's reopen (after pickling) dropped ``cache_limit``: its block cache was unbounded."""
    import pickle

    from tokenloom.datasets._stream import reopen

    limit = 512 * BLOCK
    remote = _remote(url, seaweed, tmp_path / "c", cache_limit=limit)
    options = remote.remote
    assert options.cache_limit == limit
    again = reopen(url, [s.name for s in remote.shards], pickle.loads(pickle.dumps(options)))
    assert again.remote.cache_limit == limit
    assert again.shards[0].source.cache.limit == limit  # pyright: ignore[reportAttributeAccessIssue]
