"""gzip-compressed jsonl (``.jsonl.gz``, ``.json.gz``): read whole, as one stream."""

from __future__ import annotations

import gzip
import zlib
from typing import Any

from tokenloom.tokenize.inputs._registry import InputReader, register

__all__ = ["JSONL_GZIP"]


class _GzipJsonl(InputReader):
    name = "gzip-compressed jsonl"
    suffixes = (".jsonl.gz", ".json.gz")
    magic = (b"\x1f\x8b",)
    stream_name = "gzip"
    stream_errors = (EOFError, gzip.BadGzipFile, zlib.error)

    def open(self, source: Any, **options: Any) -> Any:
        return gzip.GzipFile(fileobj=source, mode="rb")


JSONL_GZIP = register(_GzipJsonl())
