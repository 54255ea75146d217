"""The bounded block cache against a real S3 server: limit, Belady eviction, start-time checks, crashes."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from tokenloom.formats import RemoteOptions, open_dataset, open_writer
from tokenloom.formats.errors import ConfigError
from tokenloom.formats.io import parse_url
from tokenloom.formats.remote import BlockCache, StoreConfig, budget
from tokenloom.formats.remote.helper import head

BLOCK = 4096


def _write_native(root: Path, *, docs: int = 400) -> Path:
    rng = np.random.default_rng(7)
    with open_writer(root, format="native", dtype="uint16", vocab_size=50_000, eos_id=0, shard_size_tokens=30_000) as w:
        for _ in range(docs):
            w.add(np.append(rng.integers(1, 50_000, size=int(rng.integers(5, 400)), dtype=np.uint16), np.uint16(0)))
    return root


def cache_bytes(root: Path) -> int:
    """Bytes of data the cache directory holds (blocks, index files, temp files; not the readers' records).

    Counted under the cache's node-wide lock: a walk over several folders is no snapshot while readers
    evict in one and fill another; under the lock files only change size inside their reservations.
    """
    (root / "v1").mkdir(parents=True, exist_ok=True)
    fd = os.open(root / "v1" / "evict.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        total = 0
        for dirpath, _, files in os.walk(root):
            if Path(dirpath).name != "readers":
                for name in files:
                    with contextlib.suppress(FileNotFoundError):
                        total += os.stat(os.path.join(dirpath, name)).st_size
        return total
    finally:
        os.close(fd)


class DiskWatch:
    """Samples the cache's size on disk in a thread while a run goes on; ``peak`` is the largest seen."""

    def __init__(self, root: Path) -> None:
        self.root, self.peak, self.samples, self._stop = root, 0, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, cache_bytes(self.root))
            self.samples += 1
            time.sleep(0.002)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


# -- sizes and the pure policy ---------------------------------------------------------------------


def test_sizes_parse_and_bad_ones_are_named():
    assert budget.parse_size("20GB") == 20 * 10**9
    assert budget.parse_size("512MiB") == 512 * 2**20
    assert budget.parse_size(" 1.5 kb ") == 1500 and budget.parse_size(4096) == 4096
    assert budget.parse_size(None) is None and budget.parse_size("") is None
    for bad in ["twenty", "20 parsecs", "-5GB", 0, True]:
        with pytest.raises(ConfigError, match="cache_limit"):
            budget.parse_size(bad)  # pyright: ignore[reportArgumentType]


def test_eviction_order_is_belady():
    blocks = ["a", "b", "c", "d", "e"]
    next_use = {"a": 3, "c": 40, "d": 0, "e": 12}
    # never used again first (b), then the furthest next use: c (40), e (12), a (3), d (0: needed now)
    assert budget.eviction_order(blocks, next_use) == ["b", "c", "e", "a", "d"]
    assert budget.eviction_order(blocks, {}) == blocks  # nothing known: the given (oldest-first) order


def test_readers_nearest_next_use_wins_and_dead_or_reused_pids_are_ignored(tmp_path):
    budget.publish_needs(tmp_path, 100, {"x/y/b4096-1": 130, "x/y/b4096-2": 105})
    folder = tmp_path / "v1" / "readers"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    (folder / f"{dead_pid}.json").write_bytes(
        json.dumps({"pid": dead_pid, "started": 1, "cursor": 0, "blocks": 1, "needs": {"x/y/b4096-1": 1}}).encode()
    )
    reused = {"pid": os.getppid(), "started": -12345, "cursor": 0, "blocks": 1, "needs": {"x/y/b4096-9": 0}}
    (folder / f"{os.getppid()}.json").write_bytes(json.dumps(reused).encode())
    (folder / f"{dead_pid}.abcd.tmp").write_bytes(b"{")
    assert budget.read_needs(tmp_path) == {"x/y/b4096-1": 30, "x/y/b4096-2": 5}
    assert sorted(p.name for p in folder.iterdir()) == [f"{os.getpid()}.json"]  # stale records are gone
    budget.withdraw_needs(tmp_path)
    assert budget.read_needs(tmp_path) == {}


# -- the evictor on a real cache -------------------------------------------------------------------


@pytest.fixture
def blob(seaweed):
    """A 20-block object on the S3 server and its store config."""
    name = f"blob-{uuid.uuid4().hex[:8]}"
    data = np.random.default_rng(1).integers(0, 256, size=20 * BLOCK, dtype=np.uint8).tobytes()
    seaweed.put(f"{name}/data.bin", data)
    config = StoreConfig(parse_url(f"s3://{seaweed.bucket}/{name}"), seaweed.storage_options())
    return config, head(config, "data.bin"), data


def _cached(cache: BlockCache, obj) -> list[int]:
    folder = cache._dir(obj)
    return sorted(int(p.name.split("-")[1]) for p in folder.glob(f"b{BLOCK}-*") if "." not in p.name)


def test_eviction_follows_the_published_future_not_recency(blob, tmp_path):
    config, obj, data = blob
    cache = BlockCache(config, tmp_path / "c", BLOCK, limit=6 * BLOCK)
    for number in range(6):
        cache.ensure(obj, number)
    assert _cached(cache, obj) == [0, 1, 2, 3, 4, 5]
    key = lambda n: cache.block_key(obj, n)  # noqa: E731
    # this reader will next use 0 soon, 5 later, 1 much later; 2, 3 and 4 never again
    budget.publish_needs(cache.root, 10, {key(0): 11, key(5): 20, key(1): 90})
    for number in (6, 7, 8):
        cache.ensure(obj, number)
    assert _cached(cache, obj) == [0, 1, 5, 6, 7, 8]  # the unused ones went first (oldest first)
    later = {key(n): 10 + n for n in (7, 8, 9, 10, 11)}
    budget.publish_needs(cache.root, 10, {key(0): 11, key(5): 20, key(1): 90, **later})
    cache.ensure(obj, 9)
    assert _cached(cache, obj) == [0, 1, 5, 7, 8, 9]  # 6 is needed by nobody
    cache.ensure(obj, 10)
    assert _cached(cache, obj) == [0, 5, 7, 8, 9, 10]  # then the furthest next use: 1 (at 90)
    cache.ensure(obj, 11)
    assert _cached(cache, obj) == [0, 7, 8, 9, 10, 11]  # then 5 (at 20); 0 (at 11) stays
    for number in range(12):
        assert bytes(cache.block(obj, number)) == data[number * BLOCK : (number + 1) * BLOCK]
    assert cache_bytes(cache.root) <= 6 * BLOCK
    budget.withdraw_needs(cache.root)


def test_a_mapped_block_is_never_deleted_under_its_reader(blob, tmp_path):
    config, obj, data = blob
    reader = BlockCache(config, tmp_path / "c", BLOCK, limit=6 * BLOCK)
    mapped = reader.block(obj, 0)  # holds a shared lock while the map is live
    other = BlockCache(config, tmp_path / "c", BLOCK, limit=6 * BLOCK)
    for number in range(1, 12):
        other.ensure(obj, number)
    assert 0 in _cached(reader, obj)  # oldest and needed by nobody, but mapped: kept
    assert bytes(mapped) == data[:BLOCK]
    assert cache_bytes(reader.root) <= 6 * BLOCK


def test_a_reader_that_found_a_block_absent_never_waits_on_another_readers_pin(blob, tmp_path, monkeypatch):
    """Two DataLoader workers deadlocked: B found block 0 absent, then A published and pinned it (a shared
    lock held while mapped, for as long as A idles) while B waited for the exclusive lock to publish it."""
    import threading

    config, obj, data = blob
    a = BlockCache(config, tmp_path / "c", BLOCK, limit=6 * BLOCK)
    b = BlockCache(config, tmp_path / "c", BLOCK, limit=6 * BLOCK)
    mapped = a.block(obj, 0)  # A published block 0 and holds its pin
    got: list[object] = []
    from tokenloom.formats.remote import cache as cache_module

    real, calls = cache_module._complete, []

    def first_check_sees_nothing(path, size):  # B's first look ran before A's publish
        calls.append(path)
        return False if len(calls) == 1 else real(path, size)

    monkeypatch.setattr(cache_module, "_complete", first_check_sees_nothing)
    waiter = threading.Thread(target=lambda: got.append(b._publish(obj, f"b{BLOCK}-0", 0, BLOCK)), daemon=True)
    waiter.start()
    waiter.join(timeout=20)
    assert not waiter.is_alive(), "the reader waited on another reader's pin (deadlock)"
    assert got and bytes(b.block(obj, 0)) == data[:BLOCK] == bytes(mapped)


def test_too_small_limit_is_a_config_error_at_start(blob, tmp_path):
    config, _, _ = blob
    with pytest.raises(ConfigError, match=r"cache_limit 8192 bytes is too small for the blocks in flight"):
        BlockCache(config, tmp_path / "c", BLOCK, limit=2 * BLOCK)
    with pytest.raises(ConfigError, match="Raise cache_limit to at least"):
        budget.check_limit(40 * BLOCK, BLOCK, readers=4, lookahead_blocks=8)


def test_cache_limit_comes_from_the_environment(blob, tmp_path, monkeypatch):
    config, _, _ = blob
    monkeypatch.setenv("TOKENLOOM_CACHE_LIMIT", "1MiB")
    assert BlockCache(config, tmp_path / "c", BLOCK).limit == 2**20
    monkeypatch.setenv("TOKENLOOM_CACHE_LIMIT", "lots")
    with pytest.raises(ConfigError, match="'lots' is not a size"):
        BlockCache(config, tmp_path / "c", BLOCK)


def _index_bytes(url: str, seaweed, cache: Path) -> int:
    """The bytes a full pass leaves in ``cache`` besides the data blocks: the index files, fetched whole and never
    evicted (each shard's ``.idx`` on its first read, after the manifest at open)."""
    ds = open_dataset(
        url,
        remote=RemoteOptions.from_keywords(
            storage_options=seaweed.storage_options(), block_cache_dir=cache, block_size=BLOCK
        ),
    )
    for i in range(len(ds)):
        ds[i]
    del ds
    for block in cache.rglob(f"b{BLOCK}-*"):
        if not block.name.endswith(".lock"):
            block.unlink()
    return cache_bytes(cache)


_READER = textwrap.dedent(
    """
    import sys, json, numpy as np
    from tokenloom.formats import RemoteOptions, open_dataset
    url, cache, options, limit = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
    remote = RemoteOptions.from_keywords(storage_options=options, block_cache_dir=cache)
    remote = RemoteOptions.from_keywords(remote=remote, block_size=4096, cache_limit=limit)
    ds = open_dataset(url, remote=remote)
    order = np.random.default_rng(int(sys.argv[5])).permutation(len(ds))
    print(sum(int(np.asarray(ds[int(i)]).astype(np.int64).sum()) for i in order))
    """
)


def test_processes_sharing_a_bounded_cache_stay_under_it_and_read_right(seaweed, tmp_path):
    local = _write_native(tmp_path / "local")
    url = seaweed.upload_dir(local, f"ds-{uuid.uuid4().hex[:8]}")
    expected = open_dataset(local)
    total = str(sum(int(expected[i].astype(np.int64).sum()) for i in range(len(expected))))
    cache = tmp_path / "node-cache"
    index_bytes = _index_bytes(url, seaweed, cache)
    limit = index_bytes + 3 * budget.PINNED_PER_READER * BLOCK
    data_bytes = sum(p.stat().st_size for p in local.glob("*.bin"))
    assert data_bytes > 2 * (limit - index_bytes)  # the data does not fit: the run must evict
    watch = DiskWatch(cache)
    options = json.dumps(seaweed.storage_options())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _READER, url, str(cache), options, str(limit), str(seed)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for seed in range(3)
    ]
    sums = [p.communicate(timeout=240)[0].strip() for p in procs]
    peak = watch.stop()
    assert all(p.returncode == 0 for p in procs) and sums == [total] * 3
    assert watch.samples > 10 and 0 < peak <= limit, (peak, limit)


_STALLED = textwrap.dedent(
    """
    import sys, json
    from tokenloom.formats.remote import BlockCache, StoreConfig
    from tokenloom.formats.io import parse_url
    from tokenloom.formats.remote.helper import head
    config = StoreConfig(parse_url(sys.argv[1]), json.loads(sys.argv[2]))
    cache = BlockCache(config, sys.argv[3], 4096, limit=int(sys.argv[4]))
    obj = head(config, "data.bin")
    print("fetching", flush=True)
    cache.block(obj, 3)
    """
)


def test_a_reader_killed_mid_fetch_leaves_nothing_that_blocks_the_next(blob, seaweed, fault_proxy, tmp_path):
    config, obj, data = blob
    fault_proxy.stall_seconds = 30
    fault_proxy.faults = ["stall"]  # the killed reader's GET hangs: it dies holding the block's lock
    options = seaweed.storage_options(endpoint=fault_proxy.url)
    cache_dir = tmp_path / "c"
    limit = 8 * BLOCK
    child = subprocess.Popen(
        [sys.executable, "-c", _STALLED, str(config.url), json.dumps(options), str(cache_dir), str(limit)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "fetching"
    deadline = time.monotonic() + 30
    while not list(cache_dir.rglob("*.res")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(cache_dir.rglob("*.res")), "the child never reserved its block"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    started = time.monotonic()
    cache = BlockCache(config, cache_dir, BLOCK, limit=limit)
    for number in range(10):
        assert bytes(cache.block(obj, number)) == data[number * BLOCK : (number + 1) * BLOCK]
    assert time.monotonic() - started < 20  # never waited on the dead reader's lock or its reservation
    assert not list(cache_dir.rglob("*.res")) and not list(cache_dir.rglob("*.tmp"))  # dead pid's files cleaned
    assert cache_bytes(cache_dir) <= limit


def test_a_child_forked_while_a_thread_holds_a_cache_lock_does_not_inherit_it(tmp_path):
    """A DataLoader forking while a prefetch thread holds the node lock: the workers must not keep it held."""
    import fcntl
    import threading
    import time

    from tokenloom.formats.remote import budget

    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with budget.node_lock(tmp_path):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: once the parent's thread lets go, the lock must be free
        code = 1
        try:
            fd = os.open(tmp_path / "v1" / "evict.lock", os.O_RDWR)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    code = 0
                    break
                except BlockingIOError:
                    time.sleep(0.05)
        finally:
            os._exit(code)
    release.set()
    thread.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the forked child still held the lock it inherited"


def test_block_size_from_the_environment(monkeypatch, tmp_path):
    config = StoreConfig(parse_url("s3://bucket/ds"), {})
    monkeypatch.setenv("TOKENLOOM_BLOCK_SIZE", "64KiB")
    assert BlockCache(config, tmp_path).block_size == 64 << 10
    assert BlockCache(config, tmp_path, block_size=8192).block_size == 8192  # an argument wins
    monkeypatch.setenv("TOKENLOOM_BLOCK_SIZE", "5000")
    with pytest.raises(ConfigError, match="multiple of 4096"):
        BlockCache(config, tmp_path)
    monkeypatch.setenv("TOKENLOOM_BLOCK_SIZE", "big")
    with pytest.raises(ConfigError, match="TOKENLOOM_BLOCK_SIZE 'big' is not a size"):
        BlockCache(config, tmp_path)
    monkeypatch.delenv("TOKENLOOM_BLOCK_SIZE")
    assert BlockCache(config, tmp_path).block_size == 8 << 20


_WAITING_READER = textwrap.dedent(
    """
    import sys, json, time, pathlib, numpy as np
    from tokenloom.formats import RemoteOptions, open_dataset
    from tokenloom.formats.errors import ConfigError
    url, cache, barrier = sys.argv[1], sys.argv[2], sys.argv[5]
    options, limit = json.loads(sys.argv[3]), int(sys.argv[4])
    remote = RemoteOptions.from_keywords(storage_options=options, block_cache_dir=cache)
    remote = RemoteOptions.from_keywords(remote=remote, block_size=4096, cache_limit=limit)
    ds = open_dataset(url, remote=remote)
    started = time.monotonic()
    try:
        first = int(np.asarray(ds[0]).astype(np.int64).sum())  # this reader's first block: it joins the cache
    except ConfigError as error:
        print("refused", round(time.monotonic() - started, 1), str(error).replace(chr(10), " "), flush=True)
        raise SystemExit(3)
    pathlib.Path(barrier, str(__import__("os").getpid())).touch()
    while len(list(pathlib.Path(barrier).iterdir())) < int(sys.argv[6]):
        time.sleep(0.05)  # the readers that fit stay alive, pinning, until the others have tried
    print("read", first + sum(int(np.asarray(ds[i]).astype(np.int64).sum()) for i in range(1, len(ds))), flush=True)
    """
)


def test_a_limit_too_small_for_the_live_readers_pins_is_a_named_error_at_once_not_a_wait(seaweed, tmp_path):
    """Two readers fit the limit, a third does not: it is refused at its first block, naming the numbers,
    while the two read on. Before, a reader without prefetch waited ROOM_TIMEOUT (120 s) for room that the
    others' pinned blocks could never leave."""
    local = _write_native(tmp_path / "local")
    url = seaweed.upload_dir(local, f"ds-{uuid.uuid4().hex[:8]}")
    expected = open_dataset(local)
    total = sum(int(expected[i].astype(np.int64).sum()) for i in range(len(expected)))
    cache = tmp_path / "node-cache"
    index_bytes = _index_bytes(url, seaweed, cache)
    limit = index_bytes + 2 * budget.PINNED_PER_READER * BLOCK  # the pins of 2 readers, not 3
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    options = json.dumps(seaweed.storage_options())

    def start(fitting: int) -> subprocess.Popen:
        args = [url, str(cache), options, str(limit), str(barrier), str(fitting)]
        return subprocess.Popen([sys.executable, "-c", _WAITING_READER, *args], stdout=subprocess.PIPE, text=True)

    # the two that fit wait at the barrier, holding their pins, until the third has tried and this test adds the
    # barrier's third entry (waiting for just one of them let a slow second reader join after the third, on a
    # busy machine: then the second was the one refused)
    fitting = [start(3), start(3)]
    deadline = time.monotonic() + 120
    while len(list(barrier.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    third = start(3)  # joins while both readers hold their pins
    out, _ = third.communicate(timeout=60)
    (barrier / "tried").touch()
    outs = [p.communicate(timeout=240)[0] for p in fitting]
    assert all(p.returncode == 0 for p in fitting) and outs == [f"read {total}\n"] * 2, outs
    assert third.returncode == 3, out
    seconds = float(out.split()[1])
    assert seconds < budget.ROOM_TIMEOUT / 4, out  # at once, not after the wait for room
    assert f"cache_limit {limit} bytes is too small for the blocks in flight" in out, out
    assert f"x {budget.PINNED_PER_READER} pinned blocks x block_size {BLOCK}" in out, out
    assert "reader(s)" in out and "Raise cache_limit to at least" in out, out


def test_a_reader_that_fits_is_not_refused_and_the_floor_counts_only_live_readers(blob, tmp_path):
    config, obj, data = blob
    limit = budget.PINNED_PER_READER * BLOCK
    cache = BlockCache(config, tmp_path / "c", BLOCK, limit=limit)
    readers = tmp_path / "c" / "v1" / "readers"
    readers.mkdir(parents=True)
    (readers / "999999999.json").write_bytes(b'{"pid": 999999999, "started": 1, "cursor": 0, "needs": {}}')
    for number in range(12):  # one live reader (this one): 6 pinned blocks fit; the dead record is ignored
        assert bytes(cache.block(obj, number)) == data[number * BLOCK : (number + 1) * BLOCK]
    assert cache_bytes(cache.root) <= limit
    assert [r["pid"] for r in budget.live_readers(cache.root)] == [os.getpid()]
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:  # another live reader of a second cache: 2 x 6 pinned blocks cannot fit, said at this reader's first block
        second = BlockCache(config, tmp_path / "d", BLOCK, limit=limit)
        (tmp_path / "d" / "v1" / "readers").mkdir(parents=True)
        record = {"pid": other.pid, "started": budget._read_start(other.pid), "cursor": 0, "needs": {}}
        (tmp_path / "d" / "v1" / "readers" / f"{other.pid}.json").write_bytes(json.dumps(record).encode())
        with pytest.raises(ConfigError, match=r"2 reader\(s\) x 6 pinned blocks x block_size 4096 \+ 0 bytes"):
            second.block(obj, 0)
        assert [r["pid"] for r in budget.live_readers(second.root)] == [other.pid]  # the refused one withdrew
    finally:
        other.kill()
        other.wait()


_SECOND_READER = textwrap.dedent(
    """
    import sys, json, time
    from tokenloom.formats.errors import ConfigError
    from tokenloom.formats.io import parse_url
    from tokenloom.formats.remote import BlockCache, StoreConfig
    from tokenloom.formats.remote.helper import head
    url, name, root, options, limit = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), int(sys.argv[5])
    config = StoreConfig(parse_url(url), options)
    cache = BlockCache(config, root, 4096, limit=limit)
    obj = head(config, name)
    started = time.monotonic()
    try:
        for number in range(10, 20):
            cache.block(obj, number)
    except ConfigError as error:
        print("refused", round(time.monotonic() - started, 1), str(error).replace(chr(10), " "), flush=True)
        raise SystemExit(3)
    print("read", flush=True)
    """
)


def test_a_reader_whose_prefetcher_closed_still_counts_while_it_reads_on(blob, tmp_path):
    """A prefetcher that closes (the loader left the sampler's order, an epoch ended, a fetch failed) must not
    take its reader out of the count: the reader reads on, pinning blocks, and a second reader that cannot fit
    beside it is refused at once. Before, the close deleted the record and the reader never published again
    (it had joined), so the second reader passed the floor check and waited ROOM_TIMEOUT for room."""
    from tokenloom.formats.remote.prefetch import BlockPrefetcher

    config, obj, data = blob
    limit = budget.PINNED_PER_READER * BLOCK  # one reader's pins, not two
    cache = BlockCache(config, tmp_path / "c", BLOCK, limit=limit)
    prefetcher = BlockPrefetcher(range(20), lambda indices: [[(cache, obj, i)] for i in indices], lookahead=2)
    deadline = time.monotonic() + 30
    while not prefetcher.fetched and time.monotonic() < deadline:
        time.sleep(0.02)
    prefetcher.consumed([0])
    prefetcher.close()
    for number in range(6):  # reads on without prefetch: its last maps stay pinned
        assert bytes(cache.block(obj, number)) == data[number * BLOCK : (number + 1) * BLOCK]
    assert os.getpid() in [r["pid"] for r in budget.live_readers(cache.root)]
    args = [str(config.url), "data.bin", str(cache.root), json.dumps(config.storage_options), str(limit)]
    second = subprocess.Popen([sys.executable, "-c", _SECOND_READER, *args], stdout=subprocess.PIPE, text=True)
    try:
        out, _ = second.communicate(timeout=budget.ROOM_TIMEOUT / 4)
    finally:
        second.kill()
        second.wait()
    assert second.returncode == 3, out
    assert "2 reader(s) x 6 pinned blocks" in out, out
    budget.withdraw_needs(cache.root)


def test_a_reader_whose_pid_has_a_stale_record_still_counts(blob, tmp_path):
    """A record left under this process's pid by an earlier process (a container restarted with the same pids
    over a kept cache directory) is stale: this reader must publish its own, not take the stale one for it
    and then be dropped from the count when the stale record is deleted."""
    config, obj, data = blob
    cache = BlockCache(config, tmp_path / "c", BLOCK, limit=budget.PINNED_PER_READER * BLOCK)
    readers = tmp_path / "c" / "v1" / "readers"
    readers.mkdir(parents=True)
    stale = {"pid": os.getpid(), "started": 1, "cursor": 0, "needs": {}}
    (readers / f"{os.getpid()}.json").write_bytes(json.dumps(stale).encode())
    assert bytes(cache.block(obj, 0)) == data[:BLOCK]
    assert [r["pid"] for r in budget.live_readers(cache.root)] == [os.getpid()]
    budget.withdraw_needs(cache.root)


def test_the_ledger_counts_every_block_fetched_once_per_fetch_and_not_toward_the_limit(blob, tmp_path):
    from tokenloom.formats.remote.cache import fetched_bytes

    config, obj, _ = blob
    cache = BlockCache(config, tmp_path / "c", BLOCK, limit=6 * BLOCK)
    identity = {obj.url: f"{obj.size}:{obj.etag}"}
    assert fetched_bytes(cache.root, identity) == 0
    for number in (0, 1, 2):
        cache.ensure(obj, number)
    cache.ensure(obj, 1)  # cached: no fetch
    assert fetched_bytes(cache.root, identity) == 3 * BLOCK
    for number in range(3, 10):  # the limit evicts the first blocks ...
        cache.ensure(obj, number)
    cache.ensure(obj, 0)  # ... so block 0 is fetched again and counted again
    assert fetched_bytes(cache.root, identity) == 11 * BLOCK
    assert cache_bytes(cache.root) <= 6 * BLOCK  # the ledger is bookkeeping, not cached data
    assert fetched_bytes(cache.root, {obj.url: f"{obj.size}:another-etag"}) == 0  # per object version
    assert fetched_bytes(cache.root) == 11 * BLOCK  # every object of the node
