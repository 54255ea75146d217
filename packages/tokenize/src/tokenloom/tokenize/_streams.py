"""The decompressed bytes of a jsonl input: plain, gzip or zstd (every frame in turn)."""

from __future__ import annotations

import gzip
import io
from pathlib import Path
from typing import Any

from tokenloom.tokenize._sniff import InputKind, require_corpus_extra

__all__ = ["StreamError", "ZstdReader", "open_stream"]


class ZstdReader(io.RawIOBase):
    """Decompressed bytes of a zstd file (every frame in turn); a cut or corrupt stream raises ``StreamError``.

    Why not zstandard's ``stream_reader``: at the end of a truncated file it simply stops, so a
    cut download would read as a shorter, complete input.
    """

    def __init__(self, raw: io.BufferedReader) -> None:
        zstd = require_corpus_extra("zstandard", InputKind.JSONL_ZSTD)
        self._raw = raw
        self._context = zstd.ZstdDecompressor()  # type: ignore[attr-defined]
        self._zstd_error = zstd.ZstdError  # type: ignore[attr-defined]
        self._frame = self._context.decompressobj()
        self._in_frame = False
        self._buffer = memoryview(b"")
        self._position = 0

    def readable(self) -> bool:
        return True

    def _fill(self) -> bool:
        while self._position >= len(self._buffer):
            data = self._raw.read(1 << 17)
            if not data:
                if self._in_frame:
                    raise StreamError("the stream ends inside a zstd frame (the file is cut short)")
                return False
            out = []
            try:
                while data:
                    out.append(self._frame.decompress(data))
                    self._in_frame = True
                    data = b""
                    if self._frame.eof:
                        data = self._frame.unused_data
                        self._frame = self._context.decompressobj()
                        self._in_frame = False
            except self._zstd_error as exc:
                raise StreamError(f"the zstd data is corrupt ({exc})") from None
            self._buffer, self._position = memoryview(b"".join(out)), 0
        return True

    def readinto(self, buffer: Any) -> int:
        if not self._fill():
            return 0
        size = min(len(buffer), len(self._buffer) - self._position)
        buffer[:size] = self._buffer[self._position : self._position + size]
        self._position += size
        return size


class StreamError(Exception):
    """A compressed stream that cannot be read to its end."""


def open_stream(path: Path, kind: InputKind) -> tuple[Any, Any]:
    """The decompressed byte stream of a jsonl input and the raw file under it (whose position is progress)."""
    raw = open(path, "rb")  # noqa: SIM115 (closed by the returned stream)
    if kind is InputKind.JSONL_GZIP:
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw
    if kind is InputKind.JSONL_ZSTD:
        try:
            return io.BufferedReader(ZstdReader(raw), 1 << 16), raw
        except BaseException:
            raw.close()
            raise
    return raw, raw
