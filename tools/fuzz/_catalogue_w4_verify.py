"""Catalogue rows for issue #35's verified bytes: block hashes checked at fetch and at first map (127.0.0.1 only)."""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from _catalogue_base import Outcome, Run, case

from tokenloom.formats import RemoteOptions

MIB = 1 << 20


def _dataset(tmp: Path, *, block_hashes: bool = True) -> Path:
    import numpy as np

    from tokenloom.formats import open_writer
    from tokenloom.formats.io.manifest import read_manifest, write_manifest

    root = tmp / "served" / "ds"
    rng = np.random.default_rng(5)
    with open_writer(root, format="native", dtype="uint16", vocab_size=50_000, eos_id=0) as writer:
        for _ in range(4):  # about 2 MiB: two hash blocks and two cache blocks
            writer.add(np.append(rng.integers(1, 50_000, size=260_000, dtype=np.int64), 0))
    if not block_hashes:  # as written before block hashes were recorded
        manifest = read_manifest(root)
        files = tuple(dataclasses.replace(f, blocks=None) for f in manifest.files)
        write_manifest(root, dataclasses.replace(manifest, files=files, checksum=""))
    return root


def _entries(ds) -> list[bytes]:
    import numpy as np

    return [np.asarray(ds[i]).tobytes() for i in range(len(ds))]


def _served(tmp: Path, *, block_hashes: bool = True, flips: int = 0) -> tuple[Path, str, Callable[[], None], object]:
    """(local dataset, its URL behind a fault proxy flipping the first ``flips`` .bin GETs, cleanup, proxy)."""
    from tokenloom.testing.servers import FaultProxy, RangeHTTPServer

    local = _dataset(tmp, block_hashes=block_hashes)
    server = RangeHTTPServer(tmp / "served")
    proxy = FaultProxy(server.url)
    proxy.fault_paths = ".bin"
    proxy.faults = ["flip"] * flips

    def cleanup() -> None:
        proxy.close()
        server.server.shutdown()  # (RangeHTTPServer.close() sets an Event only FaultProxy has, at 7a75fb5)
        server.server.server_close()

    return local, f"{proxy.url}/ds", cleanup, proxy


class _Said(logging.Handler):
    """The tokenloom.formats.remote warnings of a row (a row runs in this process)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []
        logging.getLogger("tokenloom.formats.remote").addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def close(self) -> None:
        logging.getLogger("tokenloom.formats.remote").removeHandler(self)
        super().close()


@case("remote read: one byte flipped in a .bin GET body (right length), validate=fast", "verified bytes", "ok")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    local, url, cleanup, proxy = _served(tmp, flips=1)

    def call() -> int:
        ds = open_dataset(url, remote=RemoteOptions.from_keywords(block_cache_dir=tmp / "c", block_size=MIB))
        if _entries(ds) != _entries(open_dataset(local)):
            raise AssertionError("the flipped byte was served")
        return len(ds)

    def check(outcome: Outcome) -> str | None:
        return None if proxy.injected["flip"] == 1 else f"flips injected: {proxy.injected['flip']}"  # type: ignore[attr-defined]

    return Run(call=call, check=check, cleanup=cleanup)


@case("remote read: every GET of a .bin block arrives with a flipped byte", "verified bytes", "error", "ChecksumError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    _, url, cleanup, _ = _served(tmp, flips=50)

    def check(outcome: Outcome) -> str | None:
        text = str(outcome.exception)
        wanted = [f"{url}/shard_00000.bin", "block 0", "fetched 3 times", "the manifest records"]
        missing = [w for w in wanted if w not in text]
        return f"the error does not say {missing}" if missing else None

    return Run(
        call=lambda: _entries(
            open_dataset(url, remote=RemoteOptions.from_keywords(block_cache_dir=tmp / "c", block_size=MIB))
        ),
        check=check,
        cleanup=cleanup,
    )


@case("remote cache: a byte flipped in a cached block file on disk", "verified bytes", "ok")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    local, url, cleanup, _ = _served(tmp)
    _entries(open_dataset(url, remote=RemoteOptions.from_keywords(block_cache_dir=tmp / "c", block_size=MIB)))
    (block,) = list((tmp / "c").rglob(f"b{MIB}-1"))
    raw = bytearray(block.read_bytes())
    raw[999] ^= 0x10
    block.write_bytes(bytes(raw))
    said = _Said()

    def call() -> int:
        for _ in range(2):  # healed, then clean
            if _entries(
                open_dataset(url, remote=RemoteOptions.from_keywords(block_cache_dir=tmp / "c", block_size=MIB))
            ) != _entries(open_dataset(local)):
                raise AssertionError("the corrupt cached block was served")
        return len(said.lines)

    def check(outcome: Outcome) -> str | None:
        named = [line for line in said.lines if str(block) in line]
        return None if len(said.lines) == 1 and named else f"warnings: {said.lines}"

    def done() -> None:
        said.close()
        cleanup()

    return Run(call=call, check=check, cleanup=done)


@case("remote read: a manifest written before block hashes", "verified bytes", "ok")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    _, url, cleanup, _ = _served(tmp, block_hashes=False)
    said = _Said()

    def check(outcome: Outcome) -> str | None:
        told = [line for line in said.lines if "no block hashes" in line and "--write-manifest" in line]
        return None if len(said.lines) == 1 and told else f"not said once: {said.lines}"

    def done() -> None:
        said.close()
        cleanup()

    def call() -> int:
        return sum(
            len(open_dataset(url, remote=RemoteOptions.from_keywords(block_cache_dir=tmp / "c", block_size=MIB)))
            for _ in range(2)
        )

    return Run(call=call, check=check, cleanup=done)


@case("validate --write-manifest on a dataset whose manifest has no block hashes", "verified bytes", "ok")
def _(tmp: Path) -> Run:
    from tokenloom.formats.io.manifest import read_manifest

    local = _dataset(tmp, block_hashes=False)

    def check(outcome: Outcome) -> str | None:
        data = [f for f in read_manifest(local).files if f.role == "data"]
        return None if all(f.blocks is not None for f in data) else "no block hashes were added"

    return Run(argv=["validate", str(local), "--write-manifest"], check=check)


@case(
    "validate --write-manifest: a .bin changed since its manifest (no block hashes)",
    "verified bytes",
    "error",
    "ChecksumError",
)
def _(tmp: Path) -> Run:
    local = _dataset(tmp, block_hashes=False)
    data = local / "shard_00000.bin"
    raw = bytearray(data.read_bytes())
    raw[MIB + 3] ^= 0xFF
    data.write_bytes(bytes(raw))
    shutil.copy(local / "manifest.json", tmp / "manifest.before")

    def check(outcome: Outcome) -> str | None:
        same = (local / "manifest.json").read_bytes() == (tmp / "manifest.before").read_bytes()
        return None if same else "the manifest was rewritten over damaged data"

    return Run(argv=["validate", str(local), "--write-manifest"], check=check)
