"""Outages are waited out within a time budget, logged once per wait, and named (with the endpoint) when they last.

Real SeaweedFS behind the fault proxy: ``down_for`` mid-read, a server that accepts and never answers
(``blackhole``), and a closed port where nothing ever answers.
"""

from __future__ import annotations

import logging
import socket
import time
import uuid

import numpy as np
import pytest
from formats_helpers import open_cached, write_random_native

from tokenloom.formats import RemoteOptions, open_dataset
from tokenloom.formats.errors import ConfigError, StorageError

BLOCK = 4096


def _entries(ds, begin: int = 0, end: int | None = None) -> list[bytes]:
    return [np.asarray(ds[i]).tobytes() for i in range(begin, len(ds) if end is None else end)]


def _waits(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for ")]


# -- the budget ------------------------------------------------------------------------------------------


def test_the_default_budget_is_ten_minutes_and_the_variable_sets_it(monkeypatch):
    from tokenloom.formats.remote import RetryPolicy

    monkeypatch.delenv("TOKENLOOM_RETRY_BUDGET", raising=False)
    assert RetryPolicy().seconds() == 600.0
    assert RetryPolicy().max_retries is None  # no count: the time budget decides
    monkeypatch.setenv("TOKENLOOM_RETRY_BUDGET", "42")
    assert RetryPolicy().seconds() == 42.0
    assert RetryPolicy().resolved().budget == 42.0
    assert RetryPolicy(budget=7).seconds() == 7.0  # the policy's own value wins
    monkeypatch.setenv("TOKENLOOM_RETRY_BUDGET", "ten minutes")
    with pytest.raises(ConfigError, match="TOKENLOOM_RETRY_BUDGET='ten minutes' is not a number of seconds"):
        RetryPolicy().seconds()
    with pytest.raises(ConfigError, match="retry policy"):
        RetryPolicy(budget=0)


# -- outages against the real server --------------------------------------------------------------------


def test_a_store_down_mid_read_is_waited_out_with_identical_bytes_and_one_log_line(
    seaweed, fault_proxy, tmp_path, caplog, monkeypatch
):
    monkeypatch.delenv("TOKENLOOM_RETRY_BUDGET", raising=False)  # the default budget, 600 s
    local = write_random_native(tmp_path / "local", seed=3, docs=200)
    url = seaweed.upload_dir(local, f"ds-{uuid.uuid4().hex[:8]}")
    expected = _entries(open_dataset(local))
    options = seaweed.storage_options(endpoint=fault_proxy.url)
    with caplog.at_level(logging.WARNING, logger="tokenloom.formats.remote"):
        ds = open_cached(url, options, tmp_path / "c", BLOCK)
        half = len(ds) // 2
        got = _entries(ds, 0, half)
        fault_proxy.down_for(20, "503")  # a 20 s outage: the old 8 retries were spent in about 16 s
        began = time.monotonic()
        got += _entries(ds, half)
        waited = time.monotonic() - began
    assert got == expected
    assert fault_proxy.injected["down"] >= 3 and waited >= 19
    waits = _waits(caplog)
    assert len(waits) == 1, waits  # one line for the whole outage, not one per retry
    assert f"{url}/" in waits[0] and ": 503, attempt 1, 0 s of 600 " in waits[0]


def test_a_server_that_never_answers_is_named_within_the_budget(seaweed, fault_proxy, tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENLOOM_RETRY_BUDGET", "3")
    local = write_random_native(tmp_path / "local", seed=3, docs=200)
    url = seaweed.upload_dir(local, f"ds-{uuid.uuid4().hex[:8]}")
    options = seaweed.storage_options(endpoint=fault_proxy.url)
    ds = open_cached(url, options, tmp_path / "c", BLOCK)
    fault_proxy.down_for(120, "blackhole")  # accepts every request, answers none
    began = time.monotonic()
    with pytest.raises(StorageError) as caught:
        _entries(ds)
    took = time.monotonic() - began
    assert took < 15, took  # the budget (3 s) bounds the whole wait, not 8 retries x 30 s
    message = str(caught.value)
    assert f"{fault_proxy.url} stopped answering" in message and "no answer (timed out)" in message
    assert "3 s retry budget" in message and "TOKENLOOM_RETRY_BUDGET" in message


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_dead_endpoint_is_named_in_the_hint(seaweed, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TOKENLOOM_RETRY_BUDGET", "2")
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    options = seaweed.storage_options(endpoint=endpoint)
    began = time.monotonic()
    with pytest.raises(StorageError) as caught, caplog.at_level(logging.WARNING, logger="tokenloom.formats.remote"):
        open_dataset(
            f"s3://{seaweed.bucket}/nothing-here",
            remote=RemoteOptions.from_keywords(storage_options=options, block_cache_dir=tmp_path / "c"),
        )
    assert time.monotonic() - began < 15
    waits = _waits(caplog)
    assert len(waits) == 1 and f"nothing at {endpoint} has answered yet" in waits[0]  # said at once, not at the end
    error = caught.value
    assert str(error).startswith(f"no answer from {endpoint} ever: ")
    assert "cannot connect" in str(error)
    assert error.hint is not None and f"Check the endpoint {endpoint}" in error.hint
    assert "retry later" not in str(error)


def test_a_wait_is_said_when_it_begins_not_when_the_store_comes_back(seaweed, fault_proxy, tmp_path, monkeypatch):
    """The helper process sent its wait lines with the answer, after the outage: 5 minutes of silence, then the line."""
    import threading

    monkeypatch.delenv("TOKENLOOM_RETRY_BUDGET", raising=False)
    local = write_random_native(tmp_path / "local", seed=3, docs=200)
    url = seaweed.upload_dir(local, f"ds-{uuid.uuid4().hex[:8]}")
    options = seaweed.storage_options(endpoint=fault_proxy.url)
    ds = open_cached(url, options, tmp_path / "c", BLOCK)
    seen: list[float] = []

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("waiting for "):
                seen.append(time.monotonic())

    watch = Watch(logging.WARNING)
    logger = logging.getLogger("tokenloom.formats.remote")
    logger.addHandler(watch)
    try:
        outage = 12.0
        fault_proxy.down_for(outage, "503")
        began = time.monotonic()
        reader = threading.Thread(target=lambda: _entries(ds), daemon=True)
        reader.start()
        reader.join(timeout=120)
        assert not reader.is_alive()
    finally:
        logger.removeHandler(watch)
    assert seen, "no wait was logged"
    assert seen[0] - began < outage / 2, f"the wait was said {seen[0] - began:.1f} s into a {outage:.0f} s outage"


def test_a_new_helper_does_not_call_an_endpoint_that_answered_its_caller_never_answered(
    seaweed, fault_proxy, tmp_path, caplog, monkeypatch
):
    """A DataLoader worker's helper process is new: its first wait said "nothing has answered yet" of a live store."""
    monkeypatch.delenv("TOKENLOOM_RETRY_BUDGET", raising=False)
    from tokenloom.formats.remote import helper

    local = write_random_native(tmp_path / "local", seed=3, docs=200)
    url = seaweed.upload_dir(local, f"ds-{uuid.uuid4().hex[:8]}")
    options = seaweed.storage_options(endpoint=fault_proxy.url)
    ds = open_cached(url, options, tmp_path / "c", BLOCK)  # answered here
    helper._LOCAL.helper = None  # the next read starts a new helper process, as a forked worker's does
    from tokenloom.formats.remote import _runtime

    monkeypatch.setattr(_runtime, "in_process", lambda: False)
    with caplog.at_level(logging.WARNING, logger="tokenloom.formats.remote"):
        fault_proxy.down_for(3, "reset")
        _entries(ds, 0, 5)
    waits = _waits(caplog)
    assert waits and all("has answered yet" not in w for w in waits), waits
