"""The fault proxy's chaos features over a real ranged HTTP server: flipped bytes, a timed outage, random faults."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tokenloom.testing.servers import FaultProxy, RangeHTTPServer

BODY = bytes(range(256)) * 64


@pytest.fixture
def proxy(tmp_path: Path):
    root = tmp_path / "served"
    root.mkdir()
    for name in ("a.bin", "b.bin"):
        (root / name).write_bytes(BODY)
    server = RangeHTTPServer(root)
    proxy = FaultProxy(server.url)
    yield proxy
    proxy.close()
    server.close()


def _get(proxy: FaultProxy, name: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"{proxy.url}/{name}", timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_a_flip_keeps_the_length_and_inverts_one_byte(proxy):
    proxy.faults = ["flip"]
    status, body = _get(proxy, "a.bin")
    assert status == 200 and len(body) == len(BODY)
    (where,) = [i for i in range(len(BODY)) if body[i] != BODY[i]]
    assert body[where] == BODY[where] ^ 0xFF and proxy.injected["flip"] == 1
    assert _get(proxy, "a.bin") == (200, BODY)  # the queue is spent


def test_an_outage_answers_every_request_until_it_ends(proxy):
    proxy.down_for(1.0, "503")
    assert [_get(proxy, "a.bin")[0] for _ in range(3)] == [503] * 3
    time.sleep(1.1)
    assert _get(proxy, "a.bin") == (200, BODY) and proxy.injected["down"] == 3


def test_an_armed_outage_begins_at_the_next_request_and_lasts_its_whole_length(proxy):
    proxy.down_for(1.0, "503", armed=True)
    time.sleep(1.2)  # longer than the outage: an outage that began at arming would be over
    before = time.time()
    assert _get(proxy, "a.bin")[0] == 503 and before <= proxy.down_began <= time.time()
    assert _get(proxy, "b.bin")[0] == 503
    time.sleep(1.1)
    assert _get(proxy, "a.bin") == (200, BODY) and proxy.injected["down"] == 2


def test_random_faults_are_seeded_limited_by_path_and_503_comes_in_bursts(proxy):
    def run() -> list[tuple[str, int, bool]]:
        proxy.random_faults({"503": 0.2, "flip": 0.3}, seed=7, paths={"flip": "/a"}, burst=3)
        seen = []
        for number in range(60):
            name = "ab"[number % 2] + ".bin"
            status, body = _get(proxy, name)
            seen.append((name, status, status == 200 and body != BODY))
        return seen

    first = run()
    proxy.faults.clear()
    assert run() == first  # the same seed, the same faults on the same requests
    assert not any(flipped for name, _, flipped in first if name == "b.bin")  # flips only where the path allows
    assert any(flipped for _, _, flipped in first)
    statuses = [status for _, status, _ in first]
    starts = [i for i in range(len(statuses)) if statuses[i] == 503 and (i == 0 or statuses[i - 1] != 503)]
    assert starts and all(statuses[i : i + 3] == [503] * 3 for i in starts if i + 3 <= len(statuses))
    proxy.faults.clear()  # the rest of a burst drawn last
    proxy.random_faults({"flip": 1.0}, limits={"flip": 2})
    assert [_get(proxy, "a.bin")[1] == BODY for _ in range(4)] == [False, False, True, True]
    proxy.random_faults({})
    assert _get(proxy, "a.bin") == (200, BODY)
    with pytest.raises(ValueError, match="unknown kinds"):
        proxy.random_faults({"teapot": 0.1})
