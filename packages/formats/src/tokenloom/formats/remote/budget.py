"""The cache limit: room is made by deleting the blocks whose next use is furthest away (Belady), not LRU.

Every reader (process) that knows its future publishes it: ``CACHE/v1/readers/<pid>.json`` holds its
cursor and, for each block of its next ``lookahead`` samples, the position of its first use; the file
is replaced atomically as the reader advances, and ignored (then deleted) once its process is gone or
its pid was reused. A fetch first reserves its bytes under the node-wide lock ``CACHE/v1/evict.lock``
(a ``<block>.<pid>-<rand>.<bytes>.res`` file); when the cache would then exceed the limit, the evictor
deletes, under that lock, first the blocks nobody will use, then those used furthest in the future.
A block a process has mapped holds a shared ``flock`` on its lock file; the evictor only deletes a
block whose lock it can take exclusively without waiting, so a mapped or half-fetched block is never
deleted under its reader. Nothing here is needed for correctness: a deleted block is fetched again.
All state is files and ``flock`` (released by the kernel when a process dies): a crash leaves nothing
that blocks the next reader; temp and reservation files of dead processes are deleted by the next scan.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import orjson

from tokenloom.formats.errors import ConfigError
from tokenloom.formats.io.lock import pid_alive
from tokenloom.formats.remote._fdlocks import close_lock, open_lock

__all__ = [
    "LIMIT_ENV",
    "PINNED_PER_READER",
    "check_limit",
    "join",
    "node_lock",
    "eviction_order",
    "floor_readers",
    "live_readers",
    "make_room",
    "parse_size",
    "planned_readers",
    "publish_needs",
    "read_needs",
    "reserve",
    "withdraw_needs",
]

log = logging.getLogger("tokenloom.formats.remote")

LIMIT_ENV = "TOKENLOOM_CACHE_LIMIT"
#: the ranks torchrun started on this node (each reads through its own DataLoader workers)
LOCAL_RANKS_ENV = "LOCAL_WORLD_SIZE"
#: blocks one reader may hold mapped or in flight at once (its maps, the fetch of its main thread and
#: of its prefetch thread): the floor of any cache limit
PINNED_PER_READER = 6
#: how long a fetch waits for room (other readers' pinned blocks to be released) before it gives up
ROOM_TIMEOUT = 120.0

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_BLOCK = re.compile(r"^b\d+-\d+$")
_TEMP = re.compile(r"\.(\d+)-[0-9a-f]+\.tmp$")
_RESERVED = re.compile(r"\.(\d+)-[0-9a-f]+\.(\d+)\.res$")


def parse_size(value: int | str | None, *, field: str = "cache_limit") -> int | None:
    """Bytes from ``20GB``, ``512MiB``, ``1e9`` or an int (decimal units: KB, MB, GB, TB; binary: KiB ... TiB)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{field} is {value!r}, expected a size in bytes", field=field)
    if isinstance(value, int):
        number = value
    else:
        found = re.fullmatch(r"\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([a-zA-Z]*)\s*", str(value))
        unit = found[2].lower() if found else None
        if found is None or unit not in _UNITS:
            raise ConfigError(
                f"{field} {value!r} is not a size",
                field=field,
                hint="Write bytes as an integer or with a unit: 500MB, 20GB, 1TB (powers of 1000) or 512MiB, "
                "20GiB (powers of 1024)",
            )
        number = int(float(found[1]) * _UNITS[unit])
    if number <= 0:
        raise ConfigError(f"{field} is {value!r}, expected a positive size", field=field)
    return number


def check_limit(limit: int, block_size: int, *, readers: int, lookahead_blocks: int = 0, where: str = "") -> None:
    """ConfigError when ``limit`` cannot hold the blocks ``readers`` readers pin and prefetch at once."""
    needed = readers * (PINNED_PER_READER + lookahead_blocks) * block_size
    if limit < needed:
        raise ConfigError(
            f"cache_limit {limit} bytes is too small for the blocks in flight{where}: {readers} reader(s) x "
            f"({PINNED_PER_READER} pinned + {lookahead_blocks} prefetched blocks) x block_size {block_size} = "
            f"{needed} bytes",
            field="cache_limit",
            hint=f"Raise cache_limit to at least {needed} bytes, or lower lookahead, block_size or the number "
            f"of readers (DataLoader workers x ranks on this node){_ranks_note()}",
        )


def _ranks_note() -> str:
    """Where the ranks counted came from, for a hint: a stale export outside torchrun multiplies them unseen."""
    ranks = os.environ.get(LOCAL_RANKS_ENV)
    return (
        f"; the ranks on this node are ${LOCAL_RANKS_ENV} (now {ranks!r}): unset it outside torchrun" if ranks else ""
    )


def planned_readers(num_workers: int | None = None) -> int:
    """The readers this job runs on this node, from its settings, not from who has started reading yet.

    Ranks on the node (``$LOCAL_WORLD_SIZE``, set by torchrun; unset, 0 or not a number: 1) x readers per
    rank: ``num_workers`` when the caller knows it (the DataLoader's), else the worker count torch reports
    inside a DataLoader worker, else 1 (a rank that reads in its main process). Every process of a job sees
    the same count at its first read, so a cache limit is accepted or refused the same way every run.
    """
    try:
        ranks = max(1, int(os.environ.get(LOCAL_RANKS_ENV, "1")))
    except ValueError:
        ranks = 1
    if num_workers is None:
        data = sys.modules.get("torch.utils.data")  # only where torch is in use: never imported from here
        info = data.get_worker_info() if data is not None else None
        num_workers = int(info.num_workers) if info is not None else 1
    return ranks * max(1, num_workers)


def floor_readers(live: int, num_workers: int | None = None) -> int:
    """The readers a limit must hold: the job's :func:`planned_readers`, or more when more are live (another
    job sharing the node's cache); a job's own readers registering late or early never change it."""
    return max(planned_readers(num_workers), live)


# -- processes ------------------------------------------------------------------------------------


_OWN_START: dict[int, int | None] = {}
#: (pid, cache root) of the bounded caches this process reads: it counts among their readers while it lives
_JOINED: set[tuple[int, Path]] = set()


def _started(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks (tells a live reader from a reused pid); None if gone."""
    if pid == os.getpid():
        if pid not in _OWN_START:
            _OWN_START[pid] = _read_start(pid)
        return _OWN_START[pid]
    return _read_start(pid)


def _read_start(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None if not pid_alive(pid) else -1


# -- the future of each reader ----------------------------------------------------------------------


def _readers_dir(root: Path) -> Path:
    return root / "v1" / "readers"


def publish_needs(root: Path, cursor: int, needs: Mapping[str, int], lookahead_blocks: int = 0) -> None:
    """Replace this process's record: ``needs`` maps a block (path under ``CACHE/v1``) to its next use."""
    folder = _readers_dir(root)
    pid = os.getpid()
    record = {"pid": pid, "started": _started(pid), "cursor": cursor, "blocks": lookahead_blocks, "needs": needs}
    temp = folder / f"{pid}.{os.urandom(4).hex()}.tmp"
    try:
        temp.write_bytes(orjson.dumps(record))
    except FileNotFoundError:  # first record here, or the cache directory was deleted meanwhile
        folder.mkdir(parents=True, exist_ok=True)
        temp.write_bytes(orjson.dumps(record))
    os.replace(temp, folder / f"{pid}.json")


def withdraw_needs(root: Path) -> None:
    """Take back this process's forecast. A process that joined the bounded cache still pins blocks while it
    lives, so it keeps an empty record and still counts (its prefetcher closing does not end its reading)."""
    if (os.getpid(), root) in _JOINED:
        publish_needs(root, 0, {})
        return
    with contextlib.suppress(FileNotFoundError):
        (_readers_dir(root) / f"{os.getpid()}.json").unlink()


def _has_own_record(root: Path) -> bool:
    """True when the record under this pid is this process's (not one left by an earlier process of that pid)."""
    try:
        record = orjson.loads((_readers_dir(root) / f"{os.getpid()}.json").read_bytes())
        return record["started"] == _started(os.getpid())
    except (FileNotFoundError, orjson.JSONDecodeError, KeyError, TypeError):
        return False


def _records(root: Path) -> Iterator[dict]:
    folder = _readers_dir(root)
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return
    for name in names:
        path = folder / name
        pid_text = name.split(".", 1)[0]
        if not pid_text.isdigit():
            continue
        if name.endswith(".tmp"):
            if not pid_alive(int(pid_text)):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            continue
        record: dict = {}
        try:
            record = orjson.loads(path.read_bytes())
            stale = record["started"] != _started(int(record["pid"]))
        except FileNotFoundError:
            continue
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            stale = True  # not ours or torn by hand: worthless as a forecast
        if stale:
            log.debug("%s: ignoring the stale reader record %s", root, name)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            continue
        yield record


def read_needs(root: Path) -> dict[str, int]:
    """For every block some live reader will use: the distance (in samples) to its nearest next use."""
    nearest: dict[str, int] = {}
    for record in _records(root):
        cursor = int(record["cursor"])
        for block, position in record["needs"].items():
            distance = max(0, int(position) - cursor)
            if distance < nearest.get(block, distance + 1):
                nearest[block] = distance
    return nearest


def live_readers(root: Path) -> list[dict]:
    """The live readers' records (pid, cursor, prefetched blocks) of the cache at ``root``."""
    return list(_records(root))


# -- room -------------------------------------------------------------------------------------------


def eviction_order(blocks: list[str], next_use: Mapping[str, int]) -> list[str]:
    """``blocks`` in the order to delete them: unused ones first (in the given order), then furthest next use."""
    unused = [b for b in blocks if b not in next_use]
    used = sorted((b for b in blocks if b in next_use), key=lambda b: -next_use[b])
    return unused + used


@contextlib.contextmanager
def node_lock(root: Path) -> Iterator[None]:
    """The node-wide lock of the cache under ``root`` (reservations, eviction; its fd is closed in forked children)."""
    folder = root / "v1"
    folder.mkdir(parents=True, exist_ok=True)
    fd = open_lock(folder / "evict.lock")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        close_lock(fd)


def _scan(root: Path) -> tuple[int, list[tuple[float, str, Path, int]], int]:
    """Bytes the cache holds or has reserved, its blocks as (mtime, key, path, size), and the bytes reserved.

    Temp and reservation files of dead processes are deleted on the way.
    """
    used = reserved = 0
    blocks: list[tuple[float, str, Path, int]] = []
    top = root / "v1"
    for url_dir in _subdirs(top):
        if url_dir.name == "readers":
            continue  # bookkeeping, not cached data (dead readers' records are deleted by _records)
        for version_dir in _subdirs(url_dir):
            for entry in os.scandir(version_dir):
                name = entry.name
                if name.endswith(".lock"):
                    continue
                temp = _TEMP.search(name) or _RESERVED.search(name)
                if temp is not None:
                    if not pid_alive(int(temp[1])):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(entry.path)
                    elif name.endswith(".res"):
                        used += int(temp[2])
                        reserved += int(temp[2])
                    continue
                try:
                    stat = entry.stat()
                except FileNotFoundError:
                    continue
                if entry.is_dir():
                    used += sum(f.stat().st_size for f in os.scandir(entry.path) if f.is_file())
                    continue
                used += stat.st_size
                if _BLOCK.match(name):
                    key = f"{url_dir.name}/{version_dir.name}/{name}"
                    blocks.append((stat.st_mtime, key, Path(entry.path), stat.st_size))
    return used, blocks, reserved


def _subdirs(folder: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(folder) if e.is_dir()]
    except FileNotFoundError:
        return []


def _delete_unpinned(path: Path) -> bool:
    """Delete a block unless a reader maps it or a fetcher holds it (its lock is taken without waiting)."""
    fd = open_lock(str(path) + ".lock")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return True
    finally:
        close_lock(fd)


def make_room(root: Path, limit: int, incoming: int) -> bool:
    """Delete blocks (Belady order) until ``incoming`` more bytes fit; False if the pinned ones do not allow it.

    The caller holds the node-wide lock.
    """
    used, blocks, _ = _scan(root)
    if used + incoming <= limit:
        return True
    blocks.sort()  # oldest first among the unused
    by_key = {key: (path, size) for _, key, path, size in blocks}
    order = eviction_order([key for _, key, _, _ in blocks], read_needs(root))
    for key in order:
        path, size = by_key[key]
        if _delete_unpinned(path):
            used -= size
            log.debug("%s: evicted %s (%d bytes)", root, key, size)
            if used + incoming <= limit:
                return True
    return False


def reserve(root: Path, final: Path, size: int, limit: int, block_size: int | None = None) -> Path:
    """Make room for ``size`` bytes and record them as reserved for ``final``; returns the reservation file.

    While the pinned blocks of other readers leave no room, it waits for them to move on; when the live
    readers' pins alone cannot fit under ``limit`` (:func:`check_floor`), no wait can end: a ConfigError now.
    """
    deadline = time.monotonic() + ROOM_TIMEOUT
    while True:
        with node_lock(root):
            if make_room(root, limit, size):
                reservation = final.with_name(f"{final.name}.{os.getpid()}-{os.urandom(4).hex()}.{size}.res")
                reservation.touch()
                return reservation
            check_floor(root, limit, block_size or size)
        if time.monotonic() > deadline:
            raise ConfigError(
                f"cache_limit {limit} bytes: no room for {size} more bytes in {root} after {ROOM_TIMEOUT:.0f}s "
                "(every cached block is mapped or being fetched by a live reader)",
                path=root,
                field="cache_limit",
                hint="Raise cache_limit, or run fewer readers on this node",
            )
        time.sleep(0.05)


def join(root: Path, limit: int, block_size: int) -> None:
    """Count this process among the readers of the bounded cache at ``root``, once per process, and check the floor.

    A reader without a prefetcher publishes an empty future (a prefetcher replaces it with its own), so
    that every live reader counts: a limit too small for the blocks all of them pin at once is a
    ConfigError at this reader's first block, not a wait for room that cannot come.
    """
    key = (os.getpid(), root)
    if key in _JOINED:
        return
    if not _has_own_record(root):
        publish_needs(root, 0, {})
    try:
        with node_lock(root):
            check_floor(root, limit, block_size)
    except ConfigError:
        withdraw_needs(root)
        raise
    _JOINED.add(key)


def check_floor(root: Path, limit: int, block_size: int) -> None:
    """ConfigError when the live readers' pinned blocks and the index files cannot fit under ``limit`` at once.

    Each reader may hold ``PINNED_PER_READER`` blocks that no eviction can delete (mapped, or being fetched);
    whole objects (index files, manifests) are never evicted. The readers counted are the job's planned ones
    (:func:`floor_readers`), not the ones that happened to register first. The caller holds the node-wide lock.
    """
    readers = floor_readers(len(live_readers(root)))
    used, blocks, reserved = _scan(root)
    fixed = used - reserved - sum(size for *_, size in blocks)
    needed = fixed + readers * PINNED_PER_READER * block_size
    if limit < needed:
        raise ConfigError(
            f"cache_limit {limit} bytes is too small for the blocks in flight of {root}: {readers} reader(s) x "
            f"{PINNED_PER_READER} pinned blocks x block_size {block_size} + {fixed} bytes of index files = "
            f"{needed} bytes",
            path=root,
            field="cache_limit",
            hint=f"Raise cache_limit to at least {needed} bytes, or run fewer readers on this node (DataLoader "
            f"workers x ranks), or lower block_size{_ranks_note()}",
        )
