"""Catalogue rows from the review of issue 35 items 5 and 7: answers that are permanent are not waited out
(no network: a local http server on 127.0.0.1)."""

from __future__ import annotations

import http.server
import threading
import time
from pathlib import Path
from typing import Any

from _catalogue_base import Outcome, Run, case

from tokenloom.formats import RemoteOptions


def _answering(status: int) -> tuple[str, Any]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_HEAD = do_GET

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def close() -> None:
        server.shutdown()
        server.server_close()

    return f"http://127.0.0.1:{server.server_port}", close


@case("open_dataset: a server that answers 501 Not Implemented, budget 60 s", "outage", "error", "StorageError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset
    from tokenloom.formats.remote import RetryPolicy

    root, close = _answering(501)
    started: list[float] = []

    def call() -> Any:
        started.append(time.monotonic())
        return open_dataset(
            f"{root}/ds/data.bin",
            remote=RemoteOptions.from_keywords(block_cache_dir=tmp / "c", retries=RetryPolicy(budget=60)),
        )

    def check(outcome: Outcome) -> str | None:
        text = f"{outcome.exception or ''}"
        if "does not implement this request" not in text:
            return f"a 501 is not named as not implemented: {text[-300:]}"
        if time.monotonic() - started[0] > 10:
            return f"a 501 was waited out as an outage ({time.monotonic() - started[0]:.0f} s)"
        return None

    return Run(call=call, check=check, cleanup=close)


@case("open_dataset: s3 endpoint is a web server answering 200 to everything", "outage", "error", "StorageError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset
    from tokenloom.formats.remote import RetryPolicy

    root, close = _answering(200)
    options = {"endpoint": root, "access_key_id": "k", "secret_access_key": "s", "region": "us-east-1"}
    started: list[float] = []

    def call() -> Any:
        started.append(time.monotonic())
        options["client_options"] = {"allow_http": True}
        return open_dataset(
            "s3://bucket/ds",
            remote=RemoteOptions.from_keywords(
                storage_options=options, block_cache_dir=tmp / "c", retries=RetryPolicy(budget=60)
            ),
        )

    def check(outcome: Outcome) -> str | None:
        text = f"{outcome.exception or ''}"
        if "the server at" not in text or f"Check the endpoint {root}" not in text:
            return f"a web server as the endpoint is not named: {text[-300:]}"
        if time.monotonic() - started[0] > 10:
            return f"it was waited out as an outage ({time.monotonic() - started[0]:.0f} s)"
        return None

    return Run(call=call, check=check, cleanup=close)
