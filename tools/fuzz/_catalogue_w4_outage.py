"""Catalogue rows for issue 35 items 5, 7 and 9: outages within a time budget, named endpoints, hints that fit
(no network: 127.0.0.1 only; the outage row runs a real SeaweedFS behind the fault proxy)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from _catalogue_base import Outcome, Run, case

from tokenloom.formats import RemoteOptions


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _silent_server() -> tuple[str, Callable[[], None]]:
    """A port that accepts connections and never answers (the kernel's backlog accepts them)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    return f"127.0.0.1:{server.getsockname()[1]}", server.close


def _options(endpoint: str) -> dict[str, Any]:
    return {
        "endpoint": endpoint,
        "access_key_id": "k",
        "secret_access_key": "catalogue-outage-secret",
        "region": "us-east-1",
        "client_options": {"allow_http": True},
    }


def _says(*words: str, within: float | None = None, started: list[float] | None = None):
    def check(outcome: Outcome) -> str | None:
        text = f"{outcome.stdout}{outcome.stderr}{outcome.exception or ''}"
        if "catalogue-outage-secret" in text:
            return "the secret appears in the error"
        missing = [word for word in words if word not in text]
        if missing:
            return f"the error does not say {missing}: {text[-300:]}"
        if within is not None and started and time.monotonic() - started[0] > within:
            return f"took {time.monotonic() - started[0]:.0f} s, more than {within:g} s"
        return None

    return check


@case("open_dataset: s3 endpoint on a closed port, TOKENLOOM_RETRY_BUDGET=2", "outage", "error", "StorageError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    endpoint = f"http://127.0.0.1:{_closed_port()}"
    started: list[float] = []

    def call() -> Any:
        started.append(time.monotonic())
        with _env(TOKENLOOM_RETRY_BUDGET="2"):
            return open_dataset(
                "s3://bucket/ds",
                remote=RemoteOptions.from_keywords(storage_options=_options(endpoint), block_cache_dir=tmp / "c"),
            )

    return Run(call=call, check=_says(f"no answer from {endpoint} ever", f"Check the endpoint {endpoint}",
                                      within=15, started=started))  # fmt: skip


@case("open_dataset: a server that accepts and never answers, budget 3 s", "outage", "error", "StorageError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    address, close = _silent_server()
    started: list[float] = []

    def call() -> Any:
        started.append(time.monotonic())
        with _env(TOKENLOOM_RETRY_BUDGET="3"):
            options = _options(f"http://{address}")
            return open_dataset(
                "s3://bucket/ds", remote=RemoteOptions.from_keywords(storage_options=options, block_cache_dir=tmp / "c")
            )

    return Run(call=call, check=_says("no answer (timed out)", "3 s retry budget", within=20, started=started),
               cleanup=close)  # fmt: skip


@case("open_dataset: TOKENLOOM_RETRY_BUDGET=ten", "outage", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    def call() -> Any:
        with _env(TOKENLOOM_RETRY_BUDGET="ten"):
            options = _options(f"http://127.0.0.1:{_closed_port()}")
            return open_dataset(
                "s3://bucket/ds", remote=RemoteOptions.from_keywords(storage_options=options, block_cache_dir=tmp / "c")
            )

    return Run(call=call, check=_says("TOKENLOOM_RETRY_BUDGET='ten' is not a number of seconds"))


@case("open_dataset: store down 8 s mid-read (SeaweedFS + fault proxy)", "outage", "ok")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset, open_writer
    from tokenloom.testing.servers import FaultProxy, SeaweedS3

    server = SeaweedS3(tmp / "seaweed")
    proxy = FaultProxy(server.endpoint)
    local = tmp / "local"
    rng = np.random.default_rng(1)
    with open_writer(local, format="native", dtype="uint16", vocab_size=50_000, eos_id=0) as writer:
        for _ in range(150):
            writer.add(np.append(rng.integers(1, 50_000, size=200, dtype=np.uint16), np.uint16(0)))
    url = server.upload_dir(local, f"ds-{uuid.uuid4().hex[:8]}")
    expected = [np.asarray(open_dataset(local)[i]).tobytes() for i in range(150)]
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    def call() -> list[bytes]:
        handler = Collect(logging.WARNING)
        logger = logging.getLogger("tokenloom.formats.remote")
        logger.addHandler(handler)
        try:
            options = server.storage_options(proxy.url)
            remote = RemoteOptions.from_keywords(storage_options=options, block_cache_dir=tmp / "c", block_size=4096)
            ds = open_dataset(url, remote=remote)
            got = [np.asarray(ds[i]).tobytes() for i in range(50)]
            proxy.down_for(8, "503")
            return got + [np.asarray(ds[i]).tobytes() for i in range(50, len(ds))]
        finally:
            logger.removeHandler(handler)

    def check(outcome: Outcome) -> str | None:
        if outcome.value != expected:
            return "the bytes read across the outage differ"
        waits = [line for line in lines if line.startswith("waiting for ")]
        return None if len(waits) == 1 else f"{len(waits)} wait lines, expected 1: {waits}"

    def cleanup() -> None:
        proxy.close()
        server.stop()

    return Run(call=call, check=check, cleanup=cleanup)


@case("open_dataset: s3://bucket/a/../ds (a '..' segment)", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    return Run(
        call=lambda: open_dataset("s3://bucket/a/../ds", remote=RemoteOptions.from_keywords(block_cache_dir=tmp / "c")),
        check=_says("has a '..' segment", "without '.' and '..' segments"),
    )


@case("tokenize --executor ray --ray-address of a port that never answers", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.tokenize import ExecutorKind, TokenizeConfig, default_tokenizer_path, tokenize

    (tmp / "in").mkdir()
    (tmp / "in" / "a.jsonl").write_text('{"text": "one two"}\n', encoding="utf-8")
    address, close = _silent_server()
    started: list[float] = []
    config = TokenizeConfig(
        input_dir=tmp / "in",
        output_dir=tmp / "out",
        tokenizer=str(default_tokenizer_path()),
        executor=ExecutorKind.RAY,
        ray_address=address,
    )

    def call() -> Any:
        started.append(time.monotonic())
        return tokenize(config)

    check = _says("accepts connections but is not a running Ray head", "it never answered", within=10, started=started)
    return Run(call=call, check=check, cleanup=close)


def _loss_tokens_corpus(tmp: Path) -> Path:
    from tokenloom.formats import open_writer

    for split in ("train", "val"):
        with open_writer(tmp / "data" / split / "a", dtype="uint16", eos_id=65535, vocab_size=65536) as writer:
            for doc in range(200):
                writer.add(np.append((np.arange(7) + doc) % 60000, 65535).astype(np.uint16))
        (tmp / "data" / split / "a" / "manifest.json").unlink()  # as GPT-Simple's own output: no EOS id anywhere
    return tmp / "data"


@case("curriculum: budget_unit loss_tokens over data without an EOS id, eos_id in the YAML", "friction", "ok")
def _(tmp: Path) -> Run:
    from tokenloom.curriculum import CurriculumConfig, CurriculumDataset

    root = _loss_tokens_corpus(tmp)
    data = {"path": str(root), "seq_len": 16, "budget_unit": "loss_tokens", "eos_id": 65535}
    return Run(call=lambda: len(CurriculumDataset(CurriculumConfig.from_dict(data), seed=1, shuffle=False)))


@case("curriculum: budget_unit loss_tokens over data without an EOS id, none in the YAML", "friction", "error",
      "ConfigError")  # fmt: skip
def _(tmp: Path) -> Run:
    from tokenloom.curriculum import CurriculumConfig, CurriculumDataset

    root = _loss_tokens_corpus(tmp)
    data = {"path": str(root), "seq_len": 16, "budget_unit": "loss_tokens"}
    return Run(
        call=lambda: CurriculumDataset(CurriculumConfig.from_dict(data), seed=1, shuffle=False),
        check=_says("eos_id: ID"),
    )


@case("curriculum: eos_id: -1", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.curriculum import CurriculumConfig

    return Run(call=lambda: CurriculumConfig.from_dict({"path": str(tmp), "eos_id": -1}))
