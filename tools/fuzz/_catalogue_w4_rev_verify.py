"""Catalogue rows from the review of issue #35's verified bytes: what the other checks trust (127.0.0.1 only)."""

from __future__ import annotations

from pathlib import Path

from _catalogue_base import Outcome, Run, case
from _catalogue_w4_verify import _dataset, _entries

from tokenloom.formats import RemoteOptions


def _behind_proxy(tmp: Path, local: Path, fault_paths: str) -> tuple[str, object, object]:
    """(URL of ``local``'s folder behind a proxy flipping the first GET with ``fault_paths``, proxy, server)."""
    from tokenloom.testing.servers import FaultProxy, RangeHTTPServer

    server = RangeHTTPServer(local.parent)
    proxy = FaultProxy(server.url)
    proxy.fault_paths = fault_paths
    proxy.faults = ["flip"]
    return f"{proxy.url}/{local.name}", proxy, server


def _closer(proxy, server):  # type: ignore[no-untyped-def]
    def cleanup() -> None:
        proxy.close()
        server.server.shutdown()
        server.server.server_close()

    return cleanup


@case("remote read: one byte flipped in the manifest.json GET body, then a second open", "verified bytes", "ok")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    local = _dataset(tmp)
    url, proxy, server = _behind_proxy(tmp, local, "manifest.json")

    def call() -> int:
        for _ in range(2):  # the flip is fetched again at the first open; the second reads the healed cache
            if _entries(open_dataset(url, remote=RemoteOptions.from_keywords(block_cache_dir=tmp / "c"))) != _entries(
                open_dataset(local)
            ):
                raise AssertionError("wrong data")
        return 2

    def check(outcome: Outcome) -> str | None:
        return None if proxy.injected["flip"] == 1 else f"flips injected: {proxy.injected['flip']}"  # type: ignore[attr-defined]

    return Run(call=call, check=check, cleanup=_closer(proxy, server))


@case("remote read: a packed file's sidecar flipped on the wire, then a second open", "verified bytes", "ok")
def _(tmp: Path) -> Run:
    from tokenloom.formats import convert_dataset, open_dataset
    from tokenloom.formats.errors import FormatError

    (tmp / "p").mkdir()
    convert_dataset(_dataset(tmp), tmp / "p" / "d.pbin", to="packed")
    url, proxy, server = _behind_proxy(tmp, tmp / "p", ".tokenloom.json")

    def call() -> int:
        try:  # the sidecar has no checksum anywhere: the first open names it ...
            open_dataset(f"{url}/d.pbin", remote=RemoteOptions.from_keywords(block_cache_dir=tmp / "c"))
            raise AssertionError("the flipped sidecar was read")
        except FormatError:
            pass
        # ... and costs that open only: the next one fetches it again
        return len(open_dataset(f"{url}/d.pbin", remote=RemoteOptions.from_keywords(block_cache_dir=tmp / "c")))

    return Run(call=call, cleanup=_closer(proxy, server))
