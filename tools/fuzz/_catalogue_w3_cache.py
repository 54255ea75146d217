"""Catalogue rows for issue #23's bounded cache and prefetch (cache_limit, crashed readers, prefetch inputs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from _catalogue_base import Outcome, Run, case, copy

from tokenloom.formats import RemoteOptions


@case("open_dataset: cache_limit='lots' (not a size)", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    return Run(
        call=lambda: open_dataset(
            "s3://bucket/ds", remote=RemoteOptions.from_keywords(block_cache_dir=tmp / "c", cache_limit="lots")
        )
    )


@case("open_dataset: cache_limit below the blocks in flight", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    def check(outcome: Outcome) -> str | None:
        return None if "Raise cache_limit to at least" in str(outcome.exception) else "no minimum named"

    return Run(
        call=lambda: open_dataset(
            "s3://bucket/ds",
            remote=RemoteOptions.from_keywords(block_cache_dir=tmp / "c", block_size=4096, cache_limit="8KB"),
        ),
        check=check,
    )


@case("open_dataset: TOKENLOOM_CACHE_LIMIT=20 parsecs", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    code = (
        "import sys\nfrom tokenloom.formats import RemoteOptions, open_dataset\n"
        "from tokenloom.formats.errors import DataError\n"
        "try:\n    open_dataset('s3://bucket/ds', remote=RemoteOptions(block_cache_dir=sys.argv[1]))\n"
        "except DataError as exc:\n    print(f'Error: {type(exc).__name__}: {exc}', file=sys.stderr); sys.exit(1)\n"
    )
    return Run(process=[sys.executable, "-c", code, str(tmp / "c")], env={"TOKENLOOM_CACHE_LIMIT": "20 parsecs"})


@case("bounded cache: a dead reader's reservation, temp file and torn record", "faults", "ok")
def _(tmp: Path) -> Run:
    from tokenloom.testing.servers import RangeHTTPServer

    served = tmp / "served"
    (served / "ds").mkdir(parents=True)
    source = copy("native", tmp)
    for path in source.iterdir():
        (served / "ds" / path.name).write_bytes(path.read_bytes())
    server = RangeHTTPServer(served)
    url = f"{server.url}/ds"
    cache = tmp / "cache"
    from tokenloom.formats import open_dataset

    open_dataset(
        url, remote=RemoteOptions.from_keywords(block_cache_dir=cache, block_size=4096)
    )  # the index files, so the dead files sit beside them
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    version_dir = next(p.parent for p in cache.rglob("whole"))
    (version_dir / f"b4096-0.{pid}-00ff.{10**12}.res").touch()  # claims a terabyte: must not block anyone
    (version_dir / f"b4096-0.{pid}-00ff.tmp").write_bytes(b"half a block")
    readers = cache / "v1" / "readers"
    readers.mkdir(parents=True, exist_ok=True)
    (readers / f"{pid}.json").write_bytes(b'{"pid": ')  # torn by a crash

    def call() -> int:
        ds = open_dataset(
            url, remote=RemoteOptions.from_keywords(block_cache_dir=cache, block_size=4096, cache_limit="1MB")
        )
        expected = open_dataset(source)
        if any(bytes(ds[i]) != bytes(expected[i]) for i in range(len(ds))):
            raise AssertionError("different entries")
        return len(ds)

    def check(outcome: Outcome) -> str | None:
        left = [p.name for p in cache.rglob("*") if str(pid) in p.name]
        return f"a dead reader's files were left: {left}" if left else None

    return Run(call=call, check=check, cleanup=server.close, sources=[source])


@case("prefetch: a sampler whose future is unknown (torch's RandomSampler)", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from torch.utils.data import RandomSampler

    from tokenloom.datasets import MemoryMappedDataset

    source = copy("native", tmp)
    ds = MemoryMappedDataset(source, seq_len=4)
    return Run(call=lambda: ds.prefetch(RandomSampler(range(len(ds)))), sources=[source])


@case("prefetch: lookahead=0", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.datasets import MemoryMappedDataset
    from tokenloom.sampler import ResumableDistributedSampler

    source = copy("native", tmp)
    ds = MemoryMappedDataset(source, seq_len=4)
    sampler = ResumableDistributedSampler(ds, num_replicas=1, rank=0)
    return Run(call=lambda: ds.prefetch(sampler, lookahead=0), sources=[source])
