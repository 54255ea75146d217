"""Catalogue rows for issue #23, every format from object storage: faults of remote inputs (127.0.0.1 only).

The rows serve datasets with tokenloom.testing.servers.RangeHTTPServer (HEAD, ranged GET,
ETag and If-Match, as an https:// store answers them) and read them through the remote layer.
"""

from __future__ import annotations

import os
import pickle
import shutil
import time
from pathlib import Path

from _catalogue_base import Outcome, Run, case, copy

from tokenloom.formats import RemoteOptions

BLOCK = 4096


def _served(tmp: Path, *names: str) -> tuple[str, Path, object]:
    """(URL of the served root, the served folder, the server) with copies of the catalogue's valid datasets."""
    from tokenloom.testing.servers import RangeHTTPServer

    root = tmp / "served"
    root.mkdir()
    for name in names:
        copy(name, root)
    server = RangeHTTPServer(root)
    return server.url, root, server


def _names_url(fragment: str):
    def check(outcome: Outcome) -> str | None:
        text = str(outcome.exception)
        return None if fragment in text and "http://127.0.0.1" in text else f"the error does not name {fragment} by URL"

    return check


@case("open_dataset: http .pbin changed under an open reader (If-Match)", "fault", "error", "ResumeMismatchError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    url, root, server = _served(tmp, "data.pbin")
    ds = open_dataset(
        f"{url}/data.pbin", remote=RemoteOptions.from_keywords(block_cache_dir=tmp / "c", block_size=BLOCK)
    )
    time.sleep(0.01)
    data = (root / "data.pbin").read_bytes()
    (root / "data.pbin").write_bytes(data[:12] + bytes(len(data) - 12 - 1) + data[-1:])  # same size, new ETag
    os.utime(root / "data.pbin", ns=(time.time_ns(), time.time_ns() + 10**9))

    def read_on_a_cold_node() -> object:
        clone = pickle.loads(pickle.dumps(ds))  # a worker on another node: the cache is empty there
        shutil.rmtree(tmp / "c")
        return [clone[i] for i in range(len(clone))]

    return Run(call=read_on_a_cold_node, check=_names_url("data.pbin"), cleanup=server.close)  # type: ignore[attr-defined]


@case("open_dataset: http flat dataset, a shard byte flipped, validate=deep", "corruption", "error", "ChecksumError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    url, root, server = _served(tmp, "flat")
    shard = sorted((root / "flat").glob("*.npy"))[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    return Run(
        call=lambda: open_dataset(
            f"{url}/flat",
            remote=RemoteOptions.from_keywords(block_cache_dir=tmp / "c", block_size=BLOCK),
            validate="deep",
        ),
        check=_names_url(shard.name),
        cleanup=server.close,  # type: ignore[attr-defined]
    )


@case("open_dataset: http native dataset whose .idx differs in size from the manifest", "corruption", "error",
      "ChecksumError")  # fmt: skip
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    url, root, server = _served(tmp, "native")
    idx = sorted((root / "native").glob("*.idx"))[0]
    idx.write_bytes(idx.read_bytes() + b"\0\0")

    def first_sample() -> object:
        ds = open_dataset(
            f"{url}/native", remote=RemoteOptions.from_keywords(block_cache_dir=tmp / "c", block_size=BLOCK)
        )
        return [ds[i] for i in range(len(ds))]  # the .idx is checked when its shard is first touched

    return Run(call=first_sample, check=_names_url(idx.name), cleanup=server.close)  # type: ignore[attr-defined]


@case("open_dataset: http directory without a manifest (cannot be listed)", "bad input", "error", "MissingFileError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    url, _, server = _served(tmp, "gpt-simple")
    return Run(
        call=lambda: open_dataset(f"{url}/gpt-simple", remote=RemoteOptions.from_keywords(block_cache_dir=tmp / "c")),
        cleanup=server.close,
    )  # type: ignore[attr-defined]


@case("open_dataset: http .pbin cut short", "corruption", "error", "TruncatedError", "FormatError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    url, root, server = _served(tmp, "data.pbin")
    data = (root / "data.pbin").read_bytes()
    (root / "data.pbin").write_bytes(data[: len(data) // 2])
    return Run(
        call=lambda: open_dataset(
            f"{url}/data.pbin", remote=RemoteOptions.from_keywords(block_cache_dir=tmp / "c", block_size=BLOCK)
        ),
        check=_names_url("data.pbin"),
        cleanup=server.close,  # type: ignore[attr-defined]
    )


@case("validate: URL with --storage-option lacking '='", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    return Run(argv=["validate", "s3://bucket/ds", "--storage-option", "endpoint", "--block-cache-dir", str(tmp / "c")])


@case("inspect: a local path with --storage-option", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    return Run(argv=["inspect", str(src), "--storage-option", "region=x"], sources=[src])


@case("validate: --write-manifest on a URL", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    return Run(argv=["validate", "s3://bucket/ds", "--write-manifest"])
