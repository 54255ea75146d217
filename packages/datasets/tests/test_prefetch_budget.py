"""The cache budget is decided from what the job runs (ranks on the node x DataLoader workers), not from which
readers registered first: real DataLoader workers and torchrun-style rank processes over a real S3 server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
from datasets_helpers import cache_bytes, cache_peak
from torch.utils.data import DataLoader, Dataset

from tokenloom.datasets import MemoryMappedDataset, collate
from tokenloom.datasets._prefetch import share_schedule
from tokenloom.formats import ConfigError, RemoteOptions, open_dataset, open_writer
from tokenloom.formats.io import parse_url
from tokenloom.formats.remote import BlockCache, StoreConfig, budget
from tokenloom.formats.remote.helper import head
from tokenloom.sampler import ResumableDistributedSampler

BLOCK = 4096
SEQ = 255  # 512-byte windows: 8 per block
LOOKAHEAD = 8


# -- the floor: the same decision whoever registered first ---------------------------------------------


class _FirstBlock(Dataset):
    """Each DataLoader worker maps one block of a bounded cache (joining its readers) and says what happened."""

    def __init__(self, cache: BlockCache, obj) -> None:
        self.cache, self.obj = cache, obj

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> str:
        try:
            self.cache.block(self.obj, index)
        except ConfigError as error:
            return "refused: " + str(error)
        time.sleep(1.0)  # holds its pins while the other worker joins
        return "read"


def _sleeper_records(root: Path, count: int) -> list[subprocess.Popen]:
    """``count`` live processes registered as readers of ``root`` (another rank's workers that started first)."""
    folder = root / "v1" / "readers"
    folder.mkdir(parents=True, exist_ok=True)
    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(count)]
    for proc in sleepers:
        record = {"pid": proc.pid, "started": budget._read_start(proc.pid), "cursor": 0, "needs": {}}
        (folder / f"{proc.pid}.json").write_bytes(json.dumps(record).encode())
    return sleepers


@pytest.mark.parametrize("limit_readers", [3, 4])
def test_the_floor_decision_is_the_same_whoever_registered_first(seaweed, tmp_path, monkeypatch, limit_readers):
    """2 ranks x 2 workers on the node; this rank's 2 workers join with 0, 1 or 2 of the other rank's workers
    registered before them. Before, the floor counted the live readers only: a limit for 3 readers' pins let
    both workers through with none registered and refused one with two (the same job passing or failing by
    timing); now it counts the 4 the job runs, every time."""
    name = f"blob-{uuid.uuid4().hex[:8]}"
    seaweed.put(f"{name}/data.bin", bytes(range(256)) * (4 * BLOCK // 256))
    config = StoreConfig(parse_url(f"s3://{seaweed.bucket}/{name}"), seaweed.storage_options())
    obj = head(config, "data.bin")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    limit = limit_readers * budget.PINNED_PER_READER * BLOCK
    outcomes = {}
    for registered in (0, 1, 2):
        root = tmp_path / f"cache-{registered}"
        sleepers = _sleeper_records(root, registered)
        try:
            ds = _FirstBlock(BlockCache(config, root, BLOCK, limit=limit), obj)
            loader = DataLoader(ds, batch_size=1, num_workers=2, collate_fn=lambda batch: batch[0])
            outcomes[registered] = sorted(result.split(":")[0] for result in loader)
            refusals = [r for r in outcomes[registered] if r != "read"]
            if refusals:
                assert all(r == "refused" for r in refusals)
        finally:
            for proc in sleepers:
                proc.kill()
                proc.wait()
    expected = ["read", "read"] if limit_readers == 4 else ["refused", "refused"]
    assert outcomes == {0: expected, 1: expected, 2: expected}, outcomes


def test_planned_readers_are_ranks_on_the_node_times_workers(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert budget.planned_readers() == 1 and budget.planned_readers(4) == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert budget.planned_readers(2) == 4 and budget.planned_readers(0) == 2
    assert budget.floor_readers(1, 2) == 4 and budget.floor_readers(3, 2) == 4 and budget.floor_readers(5, 2) == 5
    for junk in ("", "0", "-3", "two"):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", junk)
        assert budget.planned_readers(2) == 2


def test_a_refusal_names_local_world_size_when_it_multiplied_the_readers(monkeypatch, tmp_path):
    """A ``LOCAL_WORLD_SIZE`` left exported outside torchrun counts 8 ranks for one process: the refusal said
    "8 reader(s)" and blamed workers and ranks without naming where the 8 came from."""
    config = StoreConfig(parse_url("s3://bucket/ds"), {})
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    with pytest.raises(ConfigError, match=r"\$LOCAL_WORLD_SIZE \(now '8'\): unset it outside torchrun"):
        BlockCache(config, tmp_path, BLOCK, limit=2 * budget.PINNED_PER_READER * BLOCK)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    BlockCache(config, tmp_path, BLOCK, limit=2 * budget.PINNED_PER_READER * BLOCK)  # one process: it fits


# -- a torchrun-style job: 2 ranks x 2 DataLoader workers -----------------------------------------------

_RANK = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    from torch.utils.data import DataLoader
    from tokenloom.datasets import MemoryMappedDataset, collate
    from tokenloom.formats import ConfigError, RemoteOptions, open_dataset
    from tokenloom.sampler import ResumableDistributedSampler
    url, cache, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    limit, lookahead = int(sys.argv[4]), int(sys.argv[5])
    rank = int(os.environ["RANK"])
    settings = RemoteOptions.from_keywords(
        storage_options=options, block_cache_dir=cache, block_size=4096, cache_limit=limit
    )
    remote = open_dataset(url, remote=settings)
    ds = MemoryMappedDataset(remote, seq_len=255)
    sampler = ResumableDistributedSampler(ds, num_replicas=2, rank=rank, seed=5)
    ds.prefetch(sampler, batch_size=4, lookahead=lookahead)  # workers unknown here: each worker's first batch checks
    loader = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2, collate_fn=collate)
    try:
        total = sum(int(batch["input_ids"].numpy().astype(np.int64).sum()) for batch in loader)
    except ConfigError as error:
        print("refused", str(error).replace(chr(10), " "), flush=True)
        raise SystemExit(3)
    print("read", total, flush=True)
    """
)


def _start_job(url: str, seaweed, cache: Path, limit: int) -> list[subprocess.Popen]:
    """Two rank processes as torchrun starts them on one node (LOCAL_WORLD_SIZE=2), each with 2 workers."""
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
        args = [url, str(cache), json.dumps(seaweed.storage_options()), str(limit), str(LOOKAHEAD)]
        procs.append(subprocess.Popen([sys.executable, "-c", _RANK, *args], env=env, stdout=subprocess.PIPE, text=True))
    return procs


def _results(procs: list[subprocess.Popen]) -> list[tuple[int, str]]:
    return [(p.returncode, out.strip()) for p in procs for out in [p.communicate(timeout=120)[0]]]


def test_a_two_rank_two_worker_job_is_refused_every_time_or_stays_under_the_stated_bound(seaweed, tmp_path):
    local = tmp_path / "ds"
    rng = np.random.default_rng(3)
    with open_writer(
        local, format="native", dtype="uint16", vocab_size=50_000, eos_id=0, shard_size_tokens=70_000
    ) as w:
        for _ in range(1400):  # about 0.9 MB of tokens: 210 blocks
            w.add(np.append(rng.integers(1, 50_000, size=int(rng.integers(20, 600)), dtype=np.uint16), np.uint16(0)))
    url = seaweed.upload_dir(local, f"ds-{uuid.uuid4().hex[:8]}")
    here = MemoryMappedDataset(local, seq_len=SEQ)
    probe_cache = tmp_path / "probe"
    remote = MemoryMappedDataset(
        open_dataset(
            url,
            remote=RemoteOptions.from_keywords(
                storage_options=seaweed.storage_options(), block_cache_dir=probe_cache, block_size=BLOCK
            ),
        ),
        seq_len=SEQ,
    )
    index_bytes = cache_bytes(probe_cache)
    totals, windows = [], []
    for rank in range(2):  # what each rank reads, and the blocks of each worker's first lookahead window
        sampler = ResumableDistributedSampler(here, num_replicas=2, rank=rank, seed=5)
        batches = DataLoader(here, batch_size=4, sampler=sampler, collate_fn=collate)
        totals.append(sum(int(b["input_ids"].numpy().astype(np.int64).sum()) for b in batches))
        for worker in range(2):
            schedule = share_schedule(
                sampler, len(here), consumed=0, remaining=len(sampler), batch_size=4, worker=worker, num_workers=2
            )
            first = list(islice(schedule, LOOKAHEAD))
            windows.append(len({(o.url, n) for blocks in remote.blocks_of(first) for _, o, n in blocks}))
    per_reader = [(budget.PINNED_PER_READER + blocks) * BLOCK for blocks in windows]

    # below what 4 readers need in every worker (but above what 2 need): refused in both ranks of two jobs;
    # the stated bound (4 readers x their pins and lookahead, plus the index files): read right, kept under it.
    # The three jobs run at once (on different caches), so the refused ones start in another order each time.
    too_small = 4 * min(per_reader) - BLOCK
    assert too_small >= 2 * max(per_reader)  # counting 2 of the 4 readers (the race before) would let it through
    bound = index_bytes + 4 * max(per_reader)
    cache = tmp_path / "fits"
    cache.mkdir()
    with cache_peak(cache, 0.005) as peak:
        jobs = [_start_job(url, seaweed, tmp_path / f"small-{attempt}", too_small) for attempt in range(2)]
        fitting = _results(_start_job(url, seaweed, cache, bound))
        refused = [result for job in jobs for result in _results(job)]
    assert [code for code, _ in refused] == [3, 3, 3, 3], refused
    for _, out in refused:
        assert out.startswith("refused ") and f"cache_limit {too_small} bytes is too small for the blocks" in out, out
        assert "4 reader(s) x (6 pinned + " in out, out
    assert fitting == [(0, f"read {totals[0]}"), (0, f"read {totals[1]}")], fitting
    data_bytes = sum(p.stat().st_size for p in local.glob("*.bin"))
    assert data_bytes > 2 * bound and 0 < peak[0] <= bound, (peak[0], bound, data_bytes)
