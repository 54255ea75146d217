"""Catalogue rows for issue #35 items 4, 6 and 8: the cache directory (a file, a symlink loop, read-only, full),
open files (mapped blocks hold no descriptor) and a cache budget decided from the job, not from timing."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from _catalogue_base import Outcome, Run, case, copy

from tokenloom.formats import RemoteOptions

_ERROR_EXIT = (
    "from tokenloom.formats.errors import DataError\n"
    "try:\n    main()\n"
    "except DataError as exc:\n    print(f'Error: {type(exc).__name__}: {exc}', file=sys.stderr); sys.exit(1)\n"
)


def _close(server) -> None:
    """Stop a RangeHTTPServer (its ``close`` sets a ``closed`` event it does not have, on this branch's base)."""
    server.server.shutdown()
    server.server.server_close()


def _served(tmp: Path, name: str = "native"):
    """A ranged HTTP server over a copy of a catalogue dataset: (server, url, the local copy)."""
    from tokenloom.testing.servers import RangeHTTPServer

    source = copy(name, tmp)
    served = tmp / "served"
    (served / "ds").mkdir(parents=True)
    for path in source.iterdir():
        (served / "ds" / path.name).write_bytes(path.read_bytes())
    server = RangeHTTPServer(served)
    return server, f"{server.url}/ds", source


def _read_all(url: str, cache: Path) -> int:
    from tokenloom.formats import open_dataset

    ds = open_dataset(url, remote=RemoteOptions.from_keywords(block_cache_dir=cache, block_size=4096))
    return sum(len(bytes(ds[i])) for i in range(len(ds)))


def _names(directory: Path) -> Callable:
    def check(outcome: Outcome) -> str | None:
        text = str(outcome.exception) if outcome.exception is not None else outcome.stderr
        named = f"the cache directory {directory}" in text
        return None if named else f"the cache directory {directory} is not named: {text[:160]}"

    return check


@case("remote cache: cache_dir is a regular file", "faults", "error", "ConfigError")
def _(tmp: Path) -> Run:
    server, url, source = _served(tmp)
    cache = tmp / "a-file"
    cache.write_text("not a directory")
    return Run(
        call=lambda: _read_all(url, cache), check=_names(cache), cleanup=lambda: _close(server), sources=[source]
    )


@case("remote cache: cache_dir on a symlink loop", "faults", "error", "ConfigError")
def _(tmp: Path) -> Run:
    server, url, source = _served(tmp)
    loop = tmp / "loop"
    os.symlink(loop, loop)
    return Run(
        call=lambda: _read_all(url, loop / "cache"),
        check=_names(loop / "cache"),
        cleanup=lambda: _close(server),
        sources=[source],
    )


@case("remote cache: cache_dir a symlink to nowhere", "faults", "error", "ConfigError")
def _(tmp: Path) -> Run:
    server, url, source = _served(tmp)
    link = tmp / "link"
    link.symlink_to(tmp / "nowhere")
    return Run(call=lambda: _read_all(url, link), check=_names(link), cleanup=lambda: _close(server), sources=[source])


@case("remote cache: cache_dir read-only (root without DAC override, or simulated)", "faults", "error", "StorageError")
def _(tmp: Path) -> Run:
    server, url, source = _served(tmp)
    cache = tmp / "read-only"
    cache.mkdir(mode=0o555)
    cache.chmod(0o555)
    if os.geteuid() == 0 and shutil.which("setpriv"):
        code = (
            "import sys\nfrom tokenloom.formats import RemoteOptions, open_dataset\n"
            "def main():\n    remote = RemoteOptions(block_cache_dir=sys.argv[2], block_size=4096)\n"
            "    ds = open_dataset(sys.argv[1], remote=remote)\n"
            "    [bytes(ds[i]) for i in range(len(ds))]\n" + _ERROR_EXIT
        )
        drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
        command = [*drop, sys.executable, "-c", code, url, str(cache)]
        return Run(process=command, check=_names(cache), cleanup=lambda: _close(server), sources=[source])
    return _simulated(url, cache, PermissionError(errno.EACCES, "Permission denied"), server, source)


def _simulated(url: str, cache: Path, error: OSError, server, source: Path | None) -> Run:
    from tokenloom.formats.remote import cache as cache_module

    def fail(config, obj, start, end, path):
        error.filename = str(path)
        raise error

    def call() -> int:
        real, cache_module.fetch_into = cache_module.fetch_into, fail
        try:
            return _read_all(url, cache)
        finally:
            cache_module.fetch_into = real

    return Run(call=call, check=_names(cache), cleanup=lambda: _close(server), sources=[source] if source else [])


def _served_tokens(tmp: Path, docs: int) -> tuple[object, str]:
    """A ranged HTTP server over a fresh native dataset of ``docs`` documents of 2,048 tokens (4 KiB each)."""
    import numpy as np

    from tokenloom.formats import open_writer
    from tokenloom.testing.servers import RangeHTTPServer

    served = tmp / "served"
    rng = np.random.default_rng(5)
    with open_writer(served / "ds", format="native", dtype="uint16", vocab_size=50_000, eos_id=0) as writer:
        for _ in range(docs):
            writer.add(np.append(rng.integers(1, 50_000, size=2047, dtype=np.uint16), np.uint16(0)))
    server = RangeHTTPServer(served)
    return server, f"{server.url}/ds"


@case("remote cache: cache disk full (a 64 KiB tmpfs, or simulated ENOSPC)", "faults", "error", "StorageError")
def _(tmp: Path) -> Run:
    server, url = _served_tokens(tmp, 50)  # 200 KB of blocks
    mount = tmp / "tiny"
    mount.mkdir()
    mounting = ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)]
    if os.geteuid() != 0 or subprocess.run(mounting, capture_output=True).returncode != 0:
        return _simulated(url, mount / "cache", OSError(errno.ENOSPC, "No space left on device"), server, None)

    def cleanup() -> None:
        _close(server)
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)

    cache = mount / "cache"
    return Run(call=lambda: _read_all(url, cache), check=_names(cache), cleanup=cleanup)


@case("remote cache: an epoch over 1,000 blocks under ulimit -n 256, no cache limit", "faults", "ok")
def _(tmp: Path) -> Run:
    server, url = _served_tokens(tmp, 1000)  # 4 MB: 1,000 blocks of 4 KiB, each mapped once and kept mapped
    code = (
        "import resource, sys\nresource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))\n"
        "from tokenloom.formats import RemoteOptions, open_dataset\n"
        "def main():\n    remote = RemoteOptions(block_cache_dir=sys.argv[2], block_size=4096)\n"
        "    ds = open_dataset(sys.argv[1], remote=remote)\n"
        "    print(sum(len(bytes(ds[i])) for i in range(len(ds))))\n" + _ERROR_EXIT
    )

    def check(outcome: Outcome) -> str | None:
        blocks = [p for p in (tmp / "cache").rglob("b4096-*") if "." not in p.name]
        return None if len(blocks) >= 1000 else f"only {len(blocks)} blocks went through the cache"

    return Run(
        process=[sys.executable, "-c", code, url, str(tmp / "cache")], check=check, cleanup=lambda: _close(server)
    )


@case("prefetch: cache_limit for 2 of the job's 4 readers (2 ranks x 2 workers)", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.datasets import MemoryMappedDataset
    from tokenloom.formats import open_dataset
    from tokenloom.sampler import ResumableDistributedSampler

    server, url, source = _served(tmp)
    limit = 80 << 10  # 2 readers x (6 pinned + at most 4 prefetched) blocks of 4 KiB fit; 4 x (6 + 1) do not
    ds = MemoryMappedDataset(
        open_dataset(
            url, remote=RemoteOptions.from_keywords(block_cache_dir=tmp / "c", block_size=4096, cache_limit=limit)
        ),
        seq_len=4,
    )
    sampler = ResumableDistributedSampler(ds, num_replicas=2, rank=0)

    def call() -> object:
        os.environ["LOCAL_WORLD_SIZE"] = "2"  # as torchrun sets it for 2 ranks on this node
        try:
            return ds.prefetch(sampler, batch_size=1, lookahead=4, num_workers=2)
        finally:
            del os.environ["LOCAL_WORLD_SIZE"]

    def check(outcome: Outcome) -> str | None:
        text = str(outcome.exception)
        return None if "4 reader(s)" in text else f"not the job's 4 readers: {text[:160]}"

    return Run(call=call, check=check, cleanup=lambda: _close(server), sources=[source])
