"""Catalogue rows for issue #23's foundation: object-store URLs as inputs and outputs (no network: 127.0.0.1 only)."""

from __future__ import annotations

import functools
import http.server
import os
import threading
from pathlib import Path

from _catalogue_base import Outcome, Run, _cli, case, copy

_SECRET = "catalogue-secret-never-printed"


def _no_local_s3_dir(cwd: Path):
    def check(outcome: Outcome) -> str | None:
        if (cwd / "s3:").exists():
            return f"a local directory {cwd / 's3:'} was written for a URL"
        text = f"{outcome.stdout}{outcome.stderr}{outcome.exception or ''}"
        return None if "not supported yet" in text else "the refusal does not say remote output is not supported yet"

    return check


@case("tokenize: --output-dir s3://bucket/tok", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    inputs = tmp / "in"
    inputs.mkdir()
    (inputs / "a.jsonl").write_text('{"text": "one two"}\n', encoding="utf-8")
    argv = ["tokenize", "--input-dir", str(inputs), "--output-dir", "s3://bucket/tok", "--num-workers", "0"]
    return Run(argv=[*argv, "--no-progress"], check=_no_local_s3_dir(Path.cwd()))


@case("convert: an s3:// target", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    command = _cli("convert", str(src), "s3://bucket/out", "--to", "native", "--no-progress")
    return Run(
        process=["sh", "-c", f'cd "{tmp}" && exec "$@"', "sh", *command], sources=[src], check=_no_local_s3_dir(tmp)
    )


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
        call=lambda: open_dataset("s3://bucket/ds", storage_options=options, cache_dir=tmp / "c", retries=0),
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

    return Run(call=lambda: open_dataset(url, cache_dir=tmp / "c"), cleanup=cleanup)


@case("open_dataset: an s3:// URL without a bucket", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    return Run(call=lambda: open_dataset("s3://", cache_dir=tmp / "c"))


@case("open_dataset: block_size not a multiple of 4096", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    return Run(call=lambda: open_dataset("s3://bucket/ds", cache_dir=tmp / "c", block_size=1000))
