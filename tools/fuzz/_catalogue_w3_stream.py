"""Catalogue rows for issue #25 (hf-streaming at scale): remote and Hub sources, .jsonl.zst, faults, ETags.

Servers are tokenloom.testing.servers on 127.0.0.1 (no network)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _catalogue_base import Outcome, Run, _tokenizer, case, copy

_SECRET = "catalogue-stream-secret-never-printed"


def _dataset(files: Any, **options: Any) -> Any:
    from tokenloom.hf_streaming import StreamingHuggingFaceDataset

    settings: dict[str, Any] = {"seq_len": 8, "shuffle_buffer_size": 4, "data_files": files}
    settings.update(options)
    return StreamingHuggingFaceDataset("json", "train", "text", tokenizer_path=str(_tokenizer()), **settings)


def _drain(files: Any, **options: Any) -> Callable[[], int]:
    return lambda: sum(1 for _ in _dataset(files, **options))


def _corpus(tmp: Path) -> list[Path]:
    return sorted(copy("corpus", tmp).glob("*.jsonl"))


def _served(tmp: Path) -> tuple[Any, Path]:
    from tokenloom.testing.servers import RangeHTTPServer

    root = tmp / "served"
    root.mkdir()
    return RangeHTTPServer(root), root


def _names(*parts: str) -> Callable[[Outcome], str | None]:
    def check(outcome: Outcome) -> str | None:
        text = str(outcome.exception)
        if _SECRET in text:
            return "the secret appears in the error"
        missing = [p for p in parts if p not in text]
        return f"the error does not name {missing}" if missing else None

    return check


@case("hf-streaming: hf:// URL that is not a Hub dataset file", "hf-streaming remote", "error", "ConfigError")
def _(tmp: Path) -> Run:
    return Run(call=_drain(["hf://models/org/name"]), check=_names("hf://models/org/name"))


@case("hf-streaming: a glob on hf:// (the Hub cannot be listed)", "hf-streaming remote", "error", "ConfigError")
def _(tmp: Path) -> Run:
    return Run(call=_drain(["hf://datasets/org/name/data/*.jsonl"]), check=_names("hf://datasets/org/name"))


@case("hf-streaming: hf:// file missing on the Hub (404)", "hf-streaming remote", "error", "MissingFileError")
def _(tmp: Path) -> Run:
    server, root = _served(tmp)
    (root / "datasets" / "org" / "name" / "resolve" / "main").mkdir(parents=True)

    def call() -> int:
        saved = os.environ.get("HF_ENDPOINT")
        os.environ["HF_ENDPOINT"] = server.url  # the local server, never the Hub
        try:
            return _drain(["hf://datasets/org/name/data/gone.jsonl"])()
        finally:
            if saved is None:
                del os.environ["HF_ENDPOINT"]
            else:
                os.environ["HF_ENDPOINT"] = saved

    return Run(
        call=call, check=_names(f"{server.url}/datasets/org/name/resolve/main/data/gone.jsonl"), cleanup=server.close
    )


@case("hf-streaming: https .jsonl.zst cut short", "hf-streaming remote", "error", "TruncatedError")
def _(tmp: Path) -> Run:
    import zstandard

    server, root = _served(tmp)
    data = zstandard.ZstdCompressor().compress(_corpus(tmp)[0].read_bytes())
    (root / "cut.jsonl.zst").write_bytes(data[: len(data) * 2 // 3])
    url = f"{server.url}/cut.jsonl.zst"
    return Run(call=_drain([url]), check=_names(url), cleanup=server.close)


@case("hf-streaming: local .jsonl.zst with corrupt bytes", "hf-streaming remote", "error", "FormatError")
def _(tmp: Path) -> Run:
    import zstandard

    data = bytearray(zstandard.ZstdCompressor().compress(_corpus(tmp)[0].read_bytes()))
    data[len(data) // 2 : len(data) // 2 + 16] = b"\xff" * 16
    path = tmp / "bad.jsonl.zst"
    path.write_bytes(bytes(data))
    return Run(call=_drain([str(path)]), sources=[path], check=_names(str(path)))


@case("hf-streaming: https server answering 503 to every GET", "hf-streaming remote", "error", "StorageError")
def _(tmp: Path) -> Run:
    from tokenloom.formats.remote import RetryPolicy
    from tokenloom.testing.servers import FaultProxy

    server, root = _served(tmp)
    shutil.copy(_corpus(tmp)[0], root / "a.jsonl")
    proxy = FaultProxy(server.url)
    proxy.faults = ["503"] * 50

    def cleanup() -> None:
        proxy.close()
        server.close()

    url = f"{proxy.url}/a.jsonl"
    retries = RetryPolicy(max_retries=2, backoff=0.01)
    return Run(call=_drain([url], retries=retries), check=_names(url, "failed 3 times"), cleanup=cleanup)


@case("hf-streaming: s3:// endpoint where nothing listens", "hf-streaming remote", "error", "StorageError")
def _(tmp: Path) -> Run:
    options = {"endpoint": "http://127.0.0.1:9", "access_key_id": "k", "secret_access_key": _SECRET}
    options["client_options"] = {"allow_http": True}  # type: ignore[assignment]
    return Run(
        call=_drain(["s3://bucket/corpus/a.jsonl"], storage_options=options, retries=0),
        check=_names("s3://bucket/corpus/a.jsonl"),
    )


@case(
    "hf-streaming: resume after the remote object changed (ETag)", "hf-streaming remote", "error", "ResumeMismatchError"
)
def _(tmp: Path) -> Run:
    server, root = _served(tmp)
    local = _corpus(tmp)[0]
    shutil.copy(local, root / "a.jsonl")
    url = f"{server.url}/a.jsonl"
    ds = _dataset([url])
    stream = iter(ds)
    next(stream)
    state = json.loads(json.dumps(ds.state_dict()))
    (root / "a.jsonl").write_bytes(local.read_bytes().replace(b"document", b"Document"))  # same size, new ETag

    def call() -> None:
        _dataset([url]).load_state_dict(state)

    return Run(call=call, check=_names(url, "changed since the state was saved"), cleanup=server.close)


@case("hf-streaming: a state whose objects list is damaged", "hf-streaming remote", "error", "ResumeMismatchError")
def _(tmp: Path) -> Run:
    server, root = _served(tmp)
    shutil.copy(_corpus(tmp)[0], root / "a.jsonl")
    url = f"{server.url}/a.jsonl"
    ds = _dataset([url])
    state = json.loads(json.dumps(ds.state_dict()))
    state["objects"] = [[0, url]]
    return Run(call=lambda: _dataset([url]).load_state_dict(state), cleanup=server.close)


@case("hf-streaming: prefetch_blocks=-1", "hf-streaming remote", "error", "ConfigError")
def _(tmp: Path) -> Run:
    return Run(call=_drain([str(p) for p in _corpus(tmp)], prefetch_blocks=-1))
