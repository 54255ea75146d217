"""--executor ray: an address where no Ray head answers is a ConfigError within 5 s (as the README says), whatever
listens there: nothing, a port that accepts and never answers, one that closes at once (a head that died while
starting), or another program. No Ray head is needed: these are plain sockets."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tokenize_helpers import ray_config

from tokenloom.formats import ConfigError
from tokenloom.tokenize import tokenize

pytest.importorskip("ray")


def _serve(behaviour: str) -> Iterator[str]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    stop = threading.Event()
    held: list[socket.socket] = []

    def run() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if behaviour == "closes":
                conn.close()
            elif behaviour == "http":
                conn.recv(1024)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                held.append(conn)
            else:  # "silent": accepts, reads, never answers
                held.append(conn)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        server.close()
        for conn in held:
            conn.close()


@pytest.fixture(params=["silent", "closes", "http"])
def bad_head(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    for address in _serve(request.param):
        yield request.param, address


def test_a_port_that_is_not_a_live_ray_head_is_a_config_error_within_5_s(
    bad_head: tuple[str, str], jsonl_dir: Callable[..., Path], tmp_path: Path, tiny_tokenizer: Path
) -> None:
    behaviour, address = bad_head
    corpus = jsonl_dir({"a.jsonl": [{"text": "hello world"}] * 20})
    config = ray_config(corpus, tmp_path / "out", tiny_tokenizer, address)
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        tokenize(config)
    took = time.monotonic() - started
    assert took < 8, took  # the check itself waits at most 5 s; the rest is start-up
    message = str(caught.value)
    assert f"something at {address} accepts connections but is not a running Ray head" in message
    expected = {"silent": "it never answered", "closes": "closed the connection", "http": "not answer as a gRPC"}
    assert expected[behaviour] in message and "ray status --address" in message
    assert not (tmp_path / "out").exists()  # nothing written before the check


def test_the_check_alone_takes_at_most_its_timeout() -> None:
    from tokenloom.tokenize._ray import check_reachable

    for address in _serve("silent"):
        started = time.monotonic()
        with pytest.raises(ConfigError, match="it never answered"):
            check_reachable(address, timeout=1.0)
        assert time.monotonic() - started < 2.0
