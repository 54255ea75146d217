from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from tokenloom.formats import open_dataset, open_writer
from tokenloom.formats.errors import ConfigError, MissingFileError, StorageError

BLOCK = 4096


def _write_native(root: Path) -> Path:
    rng = np.random.default_rng(3)
    with open_writer(root, format="native", dtype="uint16", vocab_size=50_000, eos_id=0) as writer:
        for _ in range(200):
            doc = rng.integers(1, 50_000, size=int(rng.integers(5, 300)), dtype=np.uint16)
            writer.add(np.append(doc, np.uint16(0)))
    return root


def _entries(ds):
    return [np.asarray(ds[i]).tobytes() for i in range(len(ds))]


def test_wrong_credentials_fail_at_once_with_the_default_budget(seaweed, tmp_path, monkeypatch):
    monkeypatch.delenv("TOKENLOOM_RETRY_BUDGET", raising=False)
    url = seaweed.upload_dir(_write_native(tmp_path / "l"), f"ds-{uuid.uuid4().hex[:8]}")
    options = seaweed.storage_options(secret_access_key="wrong-secret")
    began = time.monotonic()
    with pytest.raises(StorageError) as caught:
        open_dataset(url, storage_options=options, cache_dir=tmp_path / "c")
    print(repr(caught.value), time.monotonic() - began)
    assert time.monotonic() - began < 5


def test_wrong_key_id_fail_at_once(seaweed, tmp_path, monkeypatch):
    monkeypatch.delenv("TOKENLOOM_RETRY_BUDGET", raising=False)
    url = seaweed.upload_dir(_write_native(tmp_path / "l"), f"ds-{uuid.uuid4().hex[:8]}")
    options = seaweed.storage_options(access_key_id="nobody", secret_access_key="wrong-secret")
    began = time.monotonic()
    with pytest.raises(StorageError) as caught:
        open_dataset(url, storage_options=options, cache_dir=tmp_path / "c")
    print(repr(caught.value), time.monotonic() - began)
    assert time.monotonic() - began < 5


def test_404_at_once(seaweed, tmp_path, monkeypatch):
    monkeypatch.delenv("TOKENLOOM_RETRY_BUDGET", raising=False)
    began = time.monotonic()
    with pytest.raises(MissingFileError) as caught:
        open_dataset(f"s3://{seaweed.bucket}/absent-{uuid.uuid4().hex[:6]}", storage_options=seaweed.storage_options(), cache_dir=tmp_path / "c")
    print(repr(caught.value), time.monotonic() - began)
    assert time.monotonic() - began < 5


def test_invalid_host(seaweed, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TOKENLOOM_RETRY_BUDGET", "3")
    options = seaweed.storage_options(endpoint="http://no-such-host.invalid:8333")
    began = time.monotonic()
    with pytest.raises(StorageError) as caught, caplog.at_level(logging.WARNING):
        open_dataset(f"s3://{seaweed.bucket}/x", storage_options=options, cache_dir=tmp_path / "c")
    print(repr(caught.value), caught.value.hint, time.monotonic() - began)
    print([r.getMessage() for r in caplog.records])
    assert time.monotonic() - began < 10


@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan", "inf", "1e9", "1e-9", "0.5", " 5s "])
def test_budget_values(seaweed, tmp_path, monkeypatch, value):
    url = seaweed.upload_dir(_write_native(tmp_path / "l"), f"ds-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("TOKENLOOM_RETRY_BUDGET", value)
    try:
        ds = open_dataset(url, storage_options=seaweed.storage_options(), cache_dir=tmp_path / "c")
        print(value, "OK", len(_entries(ds)))
    except Exception as exc:
        print(value, repr(exc), getattr(exc, "hint", None))


def test_blackhole_at_connect(seaweed, tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENLOOM_RETRY_BUDGET", "3")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(0)
    port = sock.getsockname()[1]
    fillers = []
    for _ in range(8):
        s = socket.socket(); s.setblocking(False)
        try: s.connect(("127.0.0.1", port))
        except BlockingIOError: pass
        fillers.append(s)
    began = time.monotonic()
    with pytest.raises(StorageError) as caught:
        open_dataset(f"s3://{seaweed.bucket}/x", storage_options=seaweed.storage_options(endpoint=f"http://127.0.0.1:{port}"), cache_dir=tmp_path / "c")
    print(repr(caught.value), caught.value.hint, time.monotonic() - began)
    assert time.monotonic() - began < 12


def test_outage_longer_than_budget(seaweed, fault_proxy, tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENLOOM_RETRY_BUDGET", "4")
    url = seaweed.upload_dir(_write_native(tmp_path / "l"), f"ds-{uuid.uuid4().hex[:8]}")
    ds = open_dataset(url, storage_options=seaweed.storage_options(endpoint=fault_proxy.url), cache_dir=tmp_path / "c", block_size=BLOCK)
    for mode in ("503", "reset"):
        fault_proxy.down_for(60, mode)
        began = time.monotonic()
        with pytest.raises(StorageError) as caught:
            _entries(ds)
        print(mode, repr(caught.value), caught.value.hint, time.monotonic() - began)
        fault_proxy.down_for(0)


def test_outage_at_open(seaweed, fault_proxy, tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENLOOM_RETRY_BUDGET", "30")
    local = _write_native(tmp_path / "l")
    url = seaweed.upload_dir(local, f"ds-{uuid.uuid4().hex[:8]}")
    for mode in ("503", "reset", "blackhole"):
        fault_proxy.down_for(4, mode)
        began = time.monotonic()
        ds = open_dataset(url, storage_options=seaweed.storage_options(endpoint=fault_proxy.url), cache_dir=tmp_path / f"c{mode}", block_size=BLOCK)
        assert _entries(ds) == _entries(open_dataset(local))
        print(mode, time.monotonic() - began)
