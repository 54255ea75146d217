"""Catalogue rows for the defects a review of wave 3's object storage found (no network: 127.0.0.1 only)."""

from __future__ import annotations

from pathlib import Path

from _catalogue_base import Outcome, Run, case

from tokenloom.formats import RemoteOptions

_SECRET = "catalogue-review-secret-never-printed"


@case("open_dataset: s3:// with an endpoint that is not a URL ('127.0.0.1:9000')", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    options = {"endpoint": "127.0.0.1:9000", "access_key_id": "k", "secret_access_key": _SECRET}

    def check(outcome: Outcome) -> str | None:
        text = str(outcome.exception)
        if _SECRET in text:
            return "the secret appears in the error"
        return None if "not an http(s) URL" in text else "the error does not say what is wrong with the endpoint"

    return Run(
        call=lambda: open_dataset(
            "s3://bucket/ds",
            remote=RemoteOptions.from_keywords(storage_options=options, block_cache_dir=tmp / "c", retries=0),
        ),
        check=check,
    )


@case("open_dataset: http:// dataset whose .idx is larger than cache_limit", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    import numpy as np

    from tokenloom.formats import open_dataset, open_writer
    from tokenloom.testing.servers import RangeHTTPServer

    with open_writer(tmp / "ds", format="native", dtype="uint16", vocab_size=1000, eos_id=0) as writer:
        for _ in range(5000):  # one shard, a .idx of about 40 kB
            writer.add(np.array([5, 6, 0], dtype=np.uint16))
    server = RangeHTTPServer(tmp)

    def check(outcome: Outcome) -> str | None:
        return None if "fetched whole" in str(outcome.exception) else "the error does not name the object too big"

    def call() -> object:
        ds = open_dataset(
            f"{server.url}/ds",
            remote=RemoteOptions.from_keywords(block_cache_dir=tmp / "c", block_size=4096, cache_limit=6 * 4096),
        )
        return ds[0]

    return Run(call=call, check=check, cleanup=server.close)
