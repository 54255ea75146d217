"""Open a source's decompressed bytes: local or remote, plain, gzip or zstd.

A remote plain jsonl file is read through a buffer of ``READ_BYTES`` (one ranged GET each) from
wherever the reader seeks, so a resume inside a unit costs one block, not the position. A
compressed stream cannot seek: it is read from its first byte (a unit is the whole file).
"""

from __future__ import annotations

import gzip
import io
from typing import Any

from tokenloom.formats import RemoteOptions, TruncatedError
from tokenloom.formats.io import require
from tokenloom.hf_streaming._remote import RangeReader
from tokenloom.hf_streaming._units import Source, SourceKind

__all__ = ["READ_BYTES", "WindowError", "ZstdStream", "open_source"]

READ_BYTES = 4 << 20
"""Bytes per ranged GET of a remote jsonl stream."""


#: Bytes read from the file per read, and the decoder's feed and fill sizes (None: tokenize's defaults).
RAW_READ_BYTES = 1 << 18
FEED_BYTES: int | None = None
FILL_BYTES: int | None = None


class WindowError(OSError):
    """A valid zstd frame whose window is over the decoder's 128 MiB (not a cut or corrupt file)."""


class ZstdStream(io.RawIOBase):
    """Decompressed bytes of a zstd stream (every frame in turn); a cut stream is a TruncatedError.

    The decoding is tokenloom-tokenize's :class:`~tokenloom.tokenize.ZstdReader` (one decoder for both
    packages: it knows when a stream ends inside a frame, and its output is bounded whatever the input, so
    the line cap holds while a bomb is read); this adds the stream's position and hf-streaming's errors.
    """

    def __init__(self, raw: Any, path: str) -> None:
        super().__init__()
        zstd = require("zstandard", distribution="tokenloom-hf-streaming", extra="zstd", purpose="reading .zst jsonl")
        from tokenloom.tokenize import ZstdReader  # a worker that reads .zst: tokenize's engine loads it anyway

        self._reader = ZstdReader(
            raw, zstd=zstd, raw_read_bytes=RAW_READ_BYTES, feed_bytes=FEED_BYTES, fill_bytes=FILL_BYTES
        )
        self._raw = raw
        self._path = path
        self._returned = 0

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        """Decompressed bytes returned so far (what a record's offset counts); the stream cannot seek."""
        return self._returned

    def readinto(self, buffer: Any) -> int:
        from tokenloom.tokenize import CutStreamError, StreamError, ZstdWindowError

        try:
            size = self._reader.readinto(buffer)
        except CutStreamError as exc:
            raise TruncatedError(
                str(exc), path=self._path, hint="Re-upload or re-compress the file (zstd -t checks it)"
            ) from None
        except ZstdWindowError as exc:
            raise WindowError(str(exc)) from None
        except StreamError as exc:
            raise OSError(str(exc)) from None
        self._returned += size
        return size

    def close(self) -> None:
        self._raw.close()
        super().close()


def _raw(source: Source) -> Any:
    if source.remote is None:
        return open(source.path, "rb")
    return io.BufferedReader(RangeReader(source.remote, source.access or RemoteOptions()), READ_BYTES)


def open_source(source: Source) -> Any:
    """The decompressed, binary byte stream of a jsonl source (seekable unless compressed)."""
    if source.kind == SourceKind.JSONL_GZ and source.remote is None:
        return gzip.open(source.path, "rb")
    raw = _raw(source)
    try:
        if source.kind == SourceKind.JSONL_GZ:  # a RangeReader holds no connection: nothing to close under it
            return gzip.GzipFile(fileobj=raw, mode="rb")
        if source.kind == SourceKind.JSONL_ZST:
            return io.BufferedReader(ZstdStream(raw, source.path), 1 << 16)
    except BaseException:
        raw.close()
        raise
    return raw
