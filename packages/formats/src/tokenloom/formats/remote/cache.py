"""The per-node block cache: an object's bytes as aligned blocks in a local directory, read back by memory map.

The cache is a pure function of (URL, ETag, block size, block number): losing it costs time, never data.
A block is fetched by one process per node: the fetcher holds an ``flock`` on the block's lock file
(released by the kernel if it dies, so a crash leaves nothing that blocks the next reader), writes a
unique temp file and renames it into place; every other process waits on the lock, then finds the
block published. Small index files are fetched whole the same way. A block is not fsynced (that cost
2-4 ms per MiB here, on the read path): a process that dies mid-write leaves only a temp file, never a
published block, and a block is used only when its size is the expected one. After an OS crash (not
a process crash) a block whose data had not reached the disk reads back short on ext4 and XFS with
their default options (they grow a new file's on-disk size only as its data is written) and is fetched
again; on a filesystem without that ordering, delete the cache directory after a machine crash.

Layout: ``CACHE/v1/<hash of URL>/<hash of ETag>/{whole, b<block size>-<n>}`` (plus ``.lock`` files).
Every block fetched adds a line (its bytes) to ``CACHE/v1/readers/fetched-<hash of URL>-<hash of ETag>.log``:
what the node fetched per object, whatever was evicted since (:func:`fetched_bytes`; a curriculum reports it
beside the bytes its samples used). Like the readers' records beside it, it is bookkeeping, not cached data:
the cache limit does not count it.

With ``limit`` (bytes, ``cache_limit=`` or ``$TOKENLOOM_CACHE_LIMIT``) the cache stays under it: see
:mod:`.budget` (Belady eviction by the readers' published futures; a mapped block holds a shared lock
and is never deleted under its reader; a deleted block is fetched again, never read wrong).

Every byte is checked where the manifest lets it be (:mod:`.verify`, hashes in :attr:`BlockCache.expected`):
a block before it is published, and again the first time a process maps it from the cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path

from tokenloom.formats.errors import ConfigError, TruncatedError
from tokenloom.formats.io.storage import storage_error, storage_errors
from tokenloom.formats.io.urls import parse_url
from tokenloom.formats.remote import budget
from tokenloom.formats.remote._cachedir import named_cache_errors
from tokenloom.formats.remote._fdlocks import close_lock, on_fork_in_child, open_lock
from tokenloom.formats.remote._mapping import map_readonly
from tokenloom.formats.remote.client import ObjectInfo, StoreConfig
from tokenloom.formats.remote.helper import fetch_into
from tokenloom.formats.remote.options import DEFAULT_BLOCK_SIZE, RemoteOptions, check_block_size
from tokenloom.formats.remote.verify import FETCH_RETRIES, Expected, discard, fetch_error, read_problem

#: a check of a fetched copy before it is published: None, or its problem (what, expected, actual)
Check = Callable[[Path], tuple[str, str, str] | None]

__all__ = [
    "BLOCK_SIZE_ENV",
    "DEFAULT_BLOCK_SIZE",
    "BlockCache",
    "default_block_size",
    "default_cache_dir",
    "fetched_bytes",
]

log = logging.getLogger("tokenloom.formats.remote")

CACHE_ENV = "TOKENLOOM_CACHE_DIR"
#: the block size of a cache built without ``block_size=`` (a size: ``64KiB``, ``1MiB``; a multiple of 4096)
BLOCK_SIZE_ENV = "TOKENLOOM_BLOCK_SIZE"


def default_block_size() -> int:
    """``$TOKENLOOM_BLOCK_SIZE`` (e.g. ``1MiB``), else :data:`DEFAULT_BLOCK_SIZE` (8 MiB)."""
    return budget.parse_size(os.environ.get(BLOCK_SIZE_ENV), field=BLOCK_SIZE_ENV) or DEFAULT_BLOCK_SIZE


def default_cache_dir() -> Path:
    """``$TOKENLOOM_CACHE_DIR``, else ``$XDG_CACHE_HOME/tokenloom/remote``, else ``~/.cache/tokenloom/remote``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tokenloom" / "remote"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _ledger(root: Path, url: str, etag: str, size: int) -> Path:
    return root / "v1" / "readers" / f"fetched-{_digest(url)}-{_digest(etag or f'size-{size}')}.log"


def _record_fetch(root: Path, obj: ObjectInfo, size: int) -> None:
    """One line of ``size`` in the object's ledger (an O_APPEND write: whole lines from any process)."""
    path = _ledger(root, obj.url, obj.etag, obj.size)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"%d\n" % size)
    finally:
        os.close(fd)


def fetched_bytes(root: str | os.PathLike[str], objects: dict[str, str] | None = None) -> int:
    """Bytes of token blocks the node's cache at ``root`` has fetched for ``objects`` ({URL: "size:ETag"});
    None: for every object."""
    if objects is None:
        ledgers = list((Path(root) / "v1" / "readers").glob("fetched-*.log"))
    else:
        ledgers = []
        for url, identity in objects.items():
            size, _, etag = identity.partition(":")
            with contextlib.suppress(ValueError):
                ledgers.append(_ledger(Path(root), url, etag, int(size)))
    total = 0
    for ledger in ledgers:
        with contextlib.suppress(OSError):  # unreadable: a figure, never a reason to fail (datasets read it at open)
            # a line that is not a number (NUL bytes after a machine crash) is skipped, not the whole ledger
            total += sum(int(line) for line in ledger.read_bytes().split() if line.isdigit())
    return total


class BlockCache:
    """Blocks of remote objects in ``block_cache_dir`` (one GET per block per node, whatever the process count)."""

    #: maps an unbounded cache keeps at hand: each is one of the kernel's ``vm.max_map_count`` (65,530 by
    #: default) per process, so keeping every block read mapped failed with ENOMEM after ~65,000 blocks (about
    #: 500 GiB at 8 MiB). Older ones are unmapped once the views handed out of them are gone, and mapped again
    #: if read again.
    resident_maps = 4096

    def __init__(
        self,
        config: StoreConfig,
        block_cache_dir: str | os.PathLike[str] | None = None,
        block_size: int | None = None,
        limit: int | str | None = None,
    ) -> None:
        block_size = check_block_size(default_block_size() if block_size is None else block_size)
        self.config = config
        self.root = Path(block_cache_dir) if block_cache_dir is not None else default_cache_dir()
        self.block_size = block_size
        self._maps: OrderedDict[tuple[str, int], memoryview] = OrderedDict()
        #: bytes the cache directory may hold (None: unbounded)
        self.limit = budget.parse_size(limit if limit is not None else os.environ.get(budget.LIMIT_ENV))
        if self.limit is not None:
            budget.check_limit(self.limit, block_size, readers=budget.planned_readers())
        self._pins: dict[tuple[str, int], int] = {}  # shared-lock fds of the mapped blocks (bounded cache)
        self._dirs: dict[tuple[str, str, int], str] = {}  # an object's folder under v1/ (hashed once)
        #: the block hashes and checksums (by object key) that fetched and cached bytes are checked against
        self.expected = Expected()
        self._verified: set[tuple[str, str, str]] = set()  # (key, etag, file name) checked in this process
        on_fork_in_child(self)

    @classmethod
    def of(cls, url: str | os.PathLike[str], options: RemoteOptions) -> BlockCache:
        """The cache ``options`` name, for the dataset at ``url``."""
        config = options.store(parse_url(url))
        return cls(config, options.block_cache_dir, options.block_size, limit=options.cache_limit)

    def at(self, config: StoreConfig) -> BlockCache:
        """This cache (same directory, block size and limit) for another prefix of the store."""
        return BlockCache(config, self.root, self.block_size, limit=self.limit)

    def _forget_after_fork(self) -> None:
        """In a forked child: the pins' fds are closed (see ``_fdlocks``); maps are pinned again on next use."""
        self._maps = OrderedDict()
        self._pins = {}
        self._verified = set()

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        on_fork_in_child(self)

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_maps"] = OrderedDict()  # maps are reopened in the receiving process
        state["_pins"] = {}  # and pinned again there
        state["_verified"] = set()  # and checked again there, at first map
        return state

    def block_key(self, obj: ObjectInfo, number: int) -> str:
        """Block ``number`` of ``obj`` as named in the readers' published needs (its path under ``CACHE/v1``)."""
        return f"{self._relative_dir(obj)}/b{self.block_size}-{number}"

    @named_cache_errors
    def ensure(self, obj: ObjectInfo, number: int) -> bool:
        """Fetch block ``number`` of ``obj`` into the cache without mapping it (prefetch); True if it was absent."""
        start = number * self.block_size
        end = min(obj.size, start + self.block_size)
        final = self._dir(obj) / f"b{self.block_size}-{number}"
        if _complete(final, end - start):
            return False
        if self.limit is not None:
            budget.join(self.root, self.limit, self.block_size)
        self._publish(obj, final.name, start, end)
        return True

    def _dir(self, obj: ObjectInfo) -> Path:
        return self.root / "v1" / self._relative_dir(obj)

    def _relative_dir(self, obj: ObjectInfo) -> str:
        key = (obj.url, obj.etag, obj.size)
        found = self._dirs.get(key)
        if found is None:
            found = self._dirs[key] = f"{_digest(obj.url)}/{_digest(obj.etag or f'size-{obj.size}')}"
        return found

    @named_cache_errors
    def block(self, obj: ObjectInfo, number: int) -> memoryview:
        """Block ``number`` of ``obj`` (read-only, memory-mapped from the cache; fetched first if absent)."""
        key = (obj.url, number)
        view = self._maps.get(key)
        if view is None:
            start = number * self.block_size
            end = min(obj.size, start + self.block_size)
            if self.limit is not None:
                budget.join(self.root, self.limit, self.block_size)
                view = self._pinned_map(obj, key, f"b{self.block_size}-{number}", start, end)
            else:
                name = f"b{self.block_size}-{number}"
                view = self._maps[key] = self._checked_map(obj, name, self._publish(obj, name, start, end), start, end)
                if len(self._maps) > self.resident_maps:
                    with contextlib.suppress(KeyError):  # another thread popped that one first
                        self._maps.popitem(last=False)
        return view

    def _checked_map(self, obj: ObjectInfo, name: str, path: Path, start: int, end: int) -> memoryview:
        """The map of ``path``, checked the first time this process maps it (a bad file is fetched again)."""
        for _attempt in range(3):
            try:
                view, inode = _map_inode(path, end - start)
            except FileNotFoundError:  # another reader discarded a bad copy: fetch it (or wait for its fetch)
                path = self._publish(obj, name, start, end)
                continue
            problem = self._map_problem(obj, name, view, start)
            if problem is None:
                return view
            view.release()
            discard(path, inode, problem)
            path = self._replace_bad(obj, name, start, end, path)
        return _map_inode(path, end - start)[0]  # fetched and checked just now, by this process or another

    def _map_problem(self, obj: ObjectInfo, name: str, view: memoryview, start: int) -> tuple[str, str, str] | None:
        """Why the mapped cache file ``name`` of ``obj`` is wrong, the first time this process maps it (else None)."""
        seen = (obj.key, obj.etag, name)
        whole = name == "whole"
        if seen in self._verified or not self.expected.checks(obj.key, self.block_size, whole):
            return None
        problem = self.expected.problem(obj.url, obj.key, view, start, whole=whole)
        if problem is None:
            self._verified.add(seen)
        return problem

    def _pinned_map(self, obj: ObjectInfo, key: tuple[str, int], name: str, start: int, end: int) -> memoryview:
        """Map a block under a shared lock held while the map is live (the evictor then leaves it alone)."""
        folder = self._dir(obj)
        final = folder / name
        while len(self._maps) >= budget.PINNED_PER_READER - 2:
            old, _ = self._maps.popitem(last=False)  # numpy views of it stay valid: an unlinked map lives on
            close_lock(self._pins.pop(old))
        with storage_errors(folder, "filling the remote-data cache"):
            folder.mkdir(parents=True, exist_ok=True)
            for _attempt in range(100):
                fd = open_lock(folder / (name + ".lock"))
                fcntl.flock(fd, fcntl.LOCK_SH)
                view = problem = None
                inode = 0
                if _complete(final, end - start):
                    try:
                        view, inode = _map_inode(final, end - start)
                    except FileNotFoundError:
                        view = None
                    problem = None if view is None else self._map_problem(obj, name, view, start)
                    if view is not None and problem is None:
                        self._maps[key], self._pins[key] = view, fd
                        return view
                close_lock(fd)
                if view is not None and problem is not None:
                    view.release()
                    discard(final, inode, problem)
                    self._replace_bad(obj, name, start, end, final)
                    continue
                self._publish(obj, name, start, end)  # evicted between the fetch and the map: fetch again
        raise ConfigError(
            f"{obj.url}: block {start // self.block_size} was evicted 100 times before it could be mapped",
            path=str(self.root),
            field="cache_limit",
            hint="The cache limit is far too small for the readers on this node: raise cache_limit",
        )

    @named_cache_errors
    def whole(self, obj: ObjectInfo, check: Check | None = None) -> Path:
        """The local path of all of ``obj`` (index files, manifests: fetched whole, once per node).

        With a checksum in :attr:`expected`, the file is checked at fetch and the first time this process
        uses it (a corrupt cached copy is discarded and fetched again). ``check`` (a manifest's own checksum)
        replaces the manifest's at fetch: a copy that fails it is fetched again, so no other process sharing the
        node cache meets a copy corrupted on the wire; one that fails every fetch is bad in the store and is
        published for the reader to name.
        """
        path = self._publish(obj, "whole", 0, obj.size, check)
        if self.expected.checks(obj.key, self.block_size, True) and (obj.key, obj.etag, "whole") not in self._verified:
            self._checked_map(obj, "whole", path, 0, obj.size).release()
            path = self._dir(obj) / "whole"
        return path

    def discard(self, obj: ObjectInfo) -> None:
        """Forget and delete every cached block of ``obj`` and its copy fetched whole (a check or a reader failed on
        its bytes: fetched again at next use)."""
        for key in [k for k in self._maps if k[0] == obj.url]:
            self._maps.pop(key)
            if key in self._pins:
                close_lock(self._pins.pop(key))
        self._verified = {seen for seen in self._verified if seen[0] != obj.key}
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self._dir(obj)):
                ours = entry.name == "whole" or entry.name.startswith(f"b{self.block_size}-")
                if ours and not entry.name.endswith((".lock", ".tmp")):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)

    def _publish(self, obj: ObjectInfo, name: str, start: int, end: int, check: Check | None = None) -> Path:
        folder = self._dir(obj)
        final = folder / name
        if _complete(final, end - start):
            return final
        if self.limit is not None and end - start > self.limit:
            raise ConfigError(  # no eviction can make room: fail now, not after budget.ROOM_TIMEOUT
                f"{obj.url} ({end - start} bytes) is fetched whole and does not fit cache_limit {self.limit} bytes",
                path=str(self.root),
                field="cache_limit",
                hint=f"Raise cache_limit above {end - start} bytes plus the blocks in flight, or unset it",
            )
        with storage_errors(folder, "filling the remote-data cache"):
            folder.mkdir(parents=True, exist_ok=True)
            with _exclusive_unless_complete(folder / (name + ".lock"), final, end - start) as acquired:
                if not acquired or _complete(final, end - start):
                    return final
                self._fetch_into_place(obj, name, start, end, final, check)
        return final

    def _fetch_into_place(
        self, obj: ObjectInfo, name: str, start: int, end: int, final: Path, check: Check | None = None
    ) -> None:
        """Fetch, check and rename into ``final`` (the caller holds its exclusive lock, or replaces a bad copy)."""
        temp = final.parent / f"{name}.{os.getpid()}-{os.urandom(4).hex()}.tmp"
        reservation = None
        if self.limit is not None:
            reservation = budget.reserve(self.root, final, end - start, self.limit, self.block_size)
        try:
            self._fetch_checked(obj, name, start, end, temp, check)
            os.replace(temp, final)
            if name != "whole":
                with contextlib.suppress(OSError):  # a figure, never a reason to fail a read
                    _record_fetch(self.root, obj, end - start)
        finally:
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()
            if reservation is not None:
                with contextlib.suppress(FileNotFoundError):
                    reservation.unlink()
        log.debug("%s: cached bytes %d-%d as %s", obj.url, start, end, final)

    def _replace_bad(self, obj: ObjectInfo, name: str, start: int, end: int, path: Path) -> Path:
        """Fetch a discarded bad cache file again, without its exclusive lock: another reader that maps the bad
        copy may pin it (hold its shared lock) for as long as it idles. The rename replaces it atomically."""
        with storage_errors(path.parent, "replacing a corrupt cached block"):
            self._fetch_into_place(obj, name, start, end, path)
        return path

    def _fetch_checked(
        self, obj: ObjectInfo, name: str, start: int, end: int, temp: Path, check: Check | None = None
    ) -> None:
        """Fetch bytes ``[start, end)`` into ``temp``, checked against the manifest or by ``check`` (fetched
        again on a mismatch)."""
        whole = name == "whole"
        if check is None and not self.expected.checks(obj.key, self.block_size, whole):
            fetch_into(self.config, obj, start, end, temp)
            return
        problem = None
        for attempt in range(FETCH_RETRIES + 1):
            fetch_into(self.config, obj, start, end, temp)
            if check is not None:
                problem = check(temp)
            else:
                problem = read_problem(self.expected, obj.url, obj.key, temp, start, whole)
            if problem is None:
                if check is None:
                    self._verified.add((obj.key, obj.etag, name))
                return
            if attempt == FETCH_RETRIES and check is not None:
                return  # the same bytes every time: bad in the store, published for the reader to name
            temp.unlink()
            if attempt == FETCH_RETRIES:
                break
            log.warning(
                "%s: %s arrived with a wrong hash (%s is %s, the manifest records %s): fetching it again (%d of %d)",
                obj.url,
                "the object" if whole else f"block {start // self.block_size}",
                problem[0],
                problem[2],
                problem[1],
                attempt + 1,
                FETCH_RETRIES,
            )
        number = name if whole else str(start // self.block_size)
        raise fetch_error(obj.url, number, start, end, problem or ("", "", ""), FETCH_RETRIES + 1)


def _complete(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def _exclusive_unless_complete(path: Path, final: Path, size: int) -> Iterator[bool]:
    """The exclusive lock to publish ``final`` (True), or False as soon as another reader has published it.

    A reader that found the block absent must not wait for the exclusive lock unconditionally: the reader
    that published the block meanwhile holds a shared lock on it while it stays mapped (a pin), possibly for
    as long as that reader idles, so a blocking wait would deadlock two DataLoader workers.
    """
    fd = open_lock(path)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if _complete(final, size):
                    yield False
                    return
                time.sleep(0.005)
        yield True
    finally:
        close_lock(fd)


def _map_inode(path: Path, size: int) -> tuple[memoryview, int]:
    """The read-only map of ``path`` and the inode mapped; FileNotFoundError as such (another reader discarded
    a bad copy: the caller fetches it again), any other OSError a StorageError."""
    if size == 0:
        return memoryview(b""), 0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise storage_error(exc, path, "mapping a cached block") from exc
    try:
        with storage_errors(path, "mapping a cached block"):
            found = os.fstat(fd)
            if found.st_size != size:
                raise TruncatedError(
                    f"cached block has {found.st_size} bytes, expected {size}",
                    path=path,
                    hint="Something else changed the cache directory; delete it (it is refilled from the store)",
                )
            return map_readonly(fd, size), found.st_ino  # holds no fd: the file closes here
    finally:
        os.close(fd)
