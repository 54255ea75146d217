"""Catalogue rows for issue #23's foundation: object-store URLs as inputs and outputs (no network: 127.0.0.1 only)."""

from __future__ import annotations

import functools
import http.server
import os
import threading
from pathlib import Path

from _catalogue_base import Outcome, Run, case

from tokenloom.formats import RemoteOptions

_SECRET = "catalogue-secret-never-printed"


@case("open_dataset: s3:// with an endpoint where nothing listens", "bad input", "error", "StorageError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    options = {"endpoint": "http://127.0.0.1:9", "access_key_id": "k", "secret_access_key": _SECRET}
    options["client_options"] = {"allow_http": True}  # type: ignore[assignment]

    def check(outcome: Outcome) -> str | None:
        text = str(outcome.exception)
        if _SECRET in text:
            return "the secret appears in the error"
        return None if "s3://bucket/ds/manifest.json" in text else "the error does not name the object URL"

    return Run(
        call=lambda: open_dataset(
            "s3://bucket/ds",
            remote=RemoteOptions.from_keywords(storage_options=options, block_cache_dir=tmp / "c", retries=0),
        ),
        check=check,
    )


@case("open_dataset: http:// URL whose manifest is missing (404)", "bad input", "error", "MissingFileError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    served = tmp / "served"
    (served / "ds").mkdir(parents=True)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=os.fspath(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/ds"

    def cleanup() -> None:
        server.shutdown()
        server.server_close()

    return Run(
        call=lambda: open_dataset(url, remote=RemoteOptions.from_keywords(block_cache_dir=tmp / "c")), cleanup=cleanup
    )


@case("open_dataset: an s3:// URL without a bucket", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    return Run(call=lambda: open_dataset("s3://", remote=RemoteOptions.from_keywords(block_cache_dir=tmp / "c")))


@case("open_dataset: block_size not a multiple of 4096", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    return Run(
        call=lambda: open_dataset(
            "s3://bucket/ds", remote=RemoteOptions.from_keywords(block_cache_dir=tmp / "c", block_size=1000)
        )
    )
