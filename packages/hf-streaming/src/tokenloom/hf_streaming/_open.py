"""Open a source's decompressed bytes: local or remote, plain, gzip or zstd.

A remote plain jsonl file is read through a buffer of ``READ_BYTES`` (one ranged GET each) from
wherever the reader seeks, so a resume inside a unit costs one block, not the position. A
compressed stream cannot seek: it is read from its first byte (a unit is the whole file).
"""

from __future__ import annotations

import gzip
import io
from typing import Any

from tokenloom.formats import TruncatedError
from tokenloom.formats.io import require
from tokenloom.hf_streaming._remote import RangeReader, RemoteAccess
from tokenloom.hf_streaming._units import Source, SourceKind

__all__ = ["READ_BYTES", "WindowError", "ZstdStream", "open_source"]

READ_BYTES = 4 << 20
"""Bytes per ranged GET of a remote jsonl stream."""


#: Compressed bytes given to the decompressor per call. A zstd block of 128 KiB can be 4 bytes (an RLE
#: block), so one call returns at most about FEED_BYTES x 32 Ki = 8 MiB: a bomb never lands in memory whole.
FEED_BYTES = 256
#: Decompressed bytes gathered per fill (at most one call's output more).
FILL_BYTES = 1 << 20


class WindowError(OSError):
    """A valid zstd frame whose window is over the decoder's 128 MiB (not a cut or corrupt file)."""


class ZstdStream(io.RawIOBase):
    """Decompressed bytes of a zstd stream (every frame in turn); a cut stream is a TruncatedError.

    zstandard's own ``stream_reader`` simply stops at the end of a truncated file, so a cut upload
    would read as a shorter, complete input: this reader knows when it is inside a frame. Its output
    is bounded whatever the input (:data:`FEED_BYTES`), so the line cap holds while a bomb is read.
    """

    def __init__(self, raw: Any, path: str) -> None:
        super().__init__()
        zstd = require("zstandard", distribution="tokenloom-hf-streaming", extra="zstd", purpose="reading .zst jsonl")
        self._raw = raw
        self._path = path
        self._context = zstd.ZstdDecompressor()
        self._zstd_error = zstd.ZstdError
        self._frame = self._context.decompressobj()
        self._in_frame = False
        self._pending = memoryview(b"")  # compressed bytes read, not yet given to the decompressor
        self._buffer = memoryview(b"")
        self._position = 0
        self._returned = 0

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        """Decompressed bytes returned so far (what a record's offset counts); the stream cannot seek."""
        return self._returned

    def _fill(self) -> bool:
        while self._position >= len(self._buffer):
            if not self._pending:
                data = self._raw.read(1 << 18)
                if not data:
                    if self._in_frame:
                        raise TruncatedError(
                            "the stream ends inside a zstd frame (the file is cut short)",
                            path=self._path,
                            hint="Re-upload or re-compress the file (zstd -t checks it)",
                        )
                    return False
                self._pending = memoryview(data)
            out: list[bytes] = []
            size = 0
            try:  # a few compressed bytes at a time: no call can return more than FEED_BYTES expand to
                while self._pending and size < FILL_BYTES:
                    data, self._pending = self._pending[:FEED_BYTES], self._pending[FEED_BYTES:]
                    while data:
                        piece = self._frame.decompress(data)
                        out.append(piece)
                        size += len(piece)
                        self._in_frame = True
                        data = b""
                        if self._frame.eof:
                            data = self._frame.unused_data
                            self._frame = self._context.decompressobj()
                            self._in_frame = False
            except self._zstd_error as exc:
                if "too much memory" in str(exc):  # a whole file made with zstd --long=28 or more
                    raise WindowError(
                        "a zstd frame needs a decoding window over 128 MiB, the most zstd decodes by default"
                    ) from None
                raise OSError(f"the zstd data is corrupt ({exc})") from None
            self._buffer, self._position = memoryview(out[0] if len(out) == 1 else b"".join(out)), 0
        return True

    def readinto(self, buffer: Any) -> int:
        if not self._fill():
            return 0
        size = min(len(buffer), len(self._buffer) - self._position)
        buffer[:size] = self._buffer[self._position : self._position + size]
        self._position += size
        self._returned += size
        return size

    def close(self) -> None:
        self._raw.close()
        super().close()


def _raw(source: Source) -> Any:
    if source.remote is None:
        return open(source.path, "rb")
    return io.BufferedReader(RangeReader(source.remote, source.access or RemoteAccess()), READ_BYTES)


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
