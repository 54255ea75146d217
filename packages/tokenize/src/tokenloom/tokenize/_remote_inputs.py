"""Inputs in object storage: ``tokenize --input-dir s3://bucket/raw`` (also gs://, az://).

    discover_remote_inputs(URL)
        -> one LIST of the prefix: every object with an input suffix, its size and ETag (no download)
        -> InputFile(path=CACHE/inputs/<hash of URL>/<hash of ETag>/<relative>, url=..., etag=...)
    local_path(file), at the first read of the file (plan cuts, engine probe, chunks):
        -> fetched whole with If-Match on the listed ETag, in ranges of 64 MiB, into a temp file
           renamed into place: a node fetches only the files its units read, each once

The run key records each input's relative path, size and ETag (not a local mtime), so every node of a
run agrees on the plan, and an object replaced between the plan and a rerun is a ResumeMismatchError
naming it. The staged copy is keyed by the ETag, so a stale copy is never read for a changed object;
losing the staging directory costs a download, never data.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from tokenloom.formats import ConfigError
from tokenloom.formats.io.urls import parse_url
from tokenloom.tokenize._inputs import InputFile
from tokenloom.tokenize._sniff import INPUT_SUFFIXES

__all__ = ["discover_remote_inputs", "input_staging_dir"]


def input_staging_dir(url: str, cache_dir: str | os.PathLike[str] | None) -> Path:
    """``CACHE/inputs/<hash of URL>``: where the objects of an input prefix are staged when read."""
    from tokenloom.formats.remote.cache import default_cache_dir

    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / "inputs" / hashlib.sha256(url.encode()).hexdigest()[:24]


def discover_remote_inputs(url: str, storage_options: dict[str, Any] | None, staging: Path) -> list[InputFile]:
    """Every input object (by suffix) under the prefix ``url``, sorted by relative key; nothing is fetched."""
    from tokenloom.formats.remote import helper
    from tokenloom.formats.remote.client import RetryPolicy, StoreConfig

    parsed = parse_url(url)
    config = StoreConfig(parsed, dict(storage_options or {}), RetryPolicy())
    listed = helper.list_objects(config)
    base = f"{parsed.prefix}/" if parsed.prefix else ""
    files = []
    for obj in listed:
        relative = obj.key[len(base) :]
        if not relative.endswith(INPUT_SUFFIXES) or relative.endswith("/"):
            continue
        tag = hashlib.sha256(obj.etag.encode()).hexdigest()[:16]
        files.append(
            InputFile(
                path=staging / tag / relative,
                relative=relative,
                size=obj.size,
                mtime_ns=0,
                url=obj.url,
                etag=obj.etag,
                remote=(config, obj),
            )
        )
    if not files:
        helper.check_bucket(config)  # a missing bucket is named as such
        raise ConfigError(
            "no input objects (.jsonl, .jsonl.gz, .jsonl.zst, .json.gz, .parquet, .arrow) under the input prefix",
            path=url,
            field="input_dir",
            hint="Check --input-dir; inputs are found recursively under the prefix by their suffix",
        )
    return sorted(files, key=lambda f: f.relative)
