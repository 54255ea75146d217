"""What an input file holds, told by its magic bytes; its suffix must agree.

A suffix alone is a promise the file may not keep (a ``.jsonl`` that is really
gzip, a ``.parquet`` that is a jsonl dump): reading it by its name would turn
every line into a malformed-JSON record, or fail deep inside a library. The
first bytes decide, and a name that disagrees is a FormatError naming both.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

from tokenloom.formats import FormatError, TruncatedError
from tokenloom.formats.io import require, storage_error

__all__ = ["INPUT_SUFFIXES", "InputKind", "claimed_kind", "require_corpus_extra", "sniff"]


class InputKind(StrEnum):
    """How an input file is read."""

    JSONL = "jsonl"
    JSONL_GZIP = "gzip-compressed jsonl"
    JSONL_ZSTD = "zstd-compressed jsonl"
    PARQUET = "parquet"
    ARROW = "Arrow IPC"

    @property
    def columnar(self) -> bool:
        return self in (InputKind.PARQUET, InputKind.ARROW)


_SUFFIX_KIND = {
    ".jsonl": InputKind.JSONL,
    ".jsonl.gz": InputKind.JSONL_GZIP,
    ".json.gz": InputKind.JSONL_GZIP,
    ".jsonl.zst": InputKind.JSONL_ZSTD,
    ".jsonl.zstd": InputKind.JSONL_ZSTD,
    ".json.zst": InputKind.JSONL_ZSTD,
    ".json.zstd": InputKind.JSONL_ZSTD,
    ".parquet": InputKind.PARQUET,
    ".arrow": InputKind.ARROW,
}
INPUT_SUFFIXES = tuple(_SUFFIX_KIND)
"""Inputs are found by these suffixes (the content must agree, see :func:`sniff`)."""

_RENAME = {
    InputKind.JSONL: ".jsonl",
    InputKind.JSONL_GZIP: ".jsonl.gz",
    InputKind.JSONL_ZSTD: ".jsonl.zst",
    InputKind.PARQUET: ".parquet",
    InputKind.ARROW: ".arrow",
}

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
PARQUET_MAGIC = b"PAR1"
ARROW_FILE_MAGIC = b"ARROW1"
ARROW_STREAM_CONTINUATION = b"\xff\xff\xff\xff"


def claimed_kind(name: str) -> InputKind | None:
    """The kind a file name promises (longest matching suffix), or None if it is not an input name."""
    for suffix in sorted(_SUFFIX_KIND, key=len, reverse=True):
        if name.endswith(suffix):
            return _SUFFIX_KIND[suffix]
    return None


def _content_kind(head: bytes) -> InputKind:
    if head.startswith(GZIP_MAGIC):
        return InputKind.JSONL_GZIP
    if head.startswith(ZSTD_MAGIC):
        return InputKind.JSONL_ZSTD
    if head.startswith(PARQUET_MAGIC):
        return InputKind.PARQUET
    if head.startswith((ARROW_FILE_MAGIC, ARROW_STREAM_CONTINUATION)):
        return InputKind.ARROW
    return InputKind.JSONL


def sniff(path: Path) -> InputKind:
    """The kind of ``path`` by its magic bytes; a FormatError if its suffix says otherwise.

    An empty file is what its name says (the reader reports it as an empty input).
    A parquet file must also end with ``PAR1``: without it the footer is missing (a cut copy).
    """
    claimed = claimed_kind(path.name)
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
            size = handle.seek(0, 2)
            tail = b""
            if size >= 8:
                handle.seek(size - 4)
                tail = handle.read(4)
    except OSError as exc:
        raise storage_error(exc, path, "reading an input file's first bytes") from exc
    if not head:
        return claimed or InputKind.JSONL
    found = _content_kind(head)
    if claimed is not None and found is not claimed:
        holds = "plain text (no gzip, zstd, parquet or Arrow magic)" if found is InputKind.JSONL else str(found)
        raise FormatError(
            f"input {path.name} is named as {claimed} but its first bytes ({head[:4].hex(' ')}) are {holds}",
            path=path,
            offset=0,
            hint=f"Rename it to end in {_RENAME[found]} if the content is right, or replace it with the file "
            "its name promises",
        )
    if found is InputKind.PARQUET and tail != PARQUET_MAGIC:
        raise TruncatedError(
            f"parquet file of {size} bytes does not end with the PAR1 magic: its footer is missing (a cut or "
            "partial copy)",
            path=path,
            offset=max(size - 4, 0),
            hint="Copy or download the file again; nothing was written",
        )
    return found


def require_corpus_extra(module: str, kind: InputKind) -> Any:
    """Import zstandard or pyarrow, or name the extra that installs them."""
    return require(module, distribution="tokenloom-tokenize", extra="corpus", purpose=f"Reading {kind} input")
