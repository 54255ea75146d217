"""zstd-compressed jsonl (every frame in turn), decoded in bounded steps: a bomb never lands in memory whole."""

from __future__ import annotations

import io
from typing import Any

from tokenloom.tokenize.inputs._registry import InputReader, register, require_corpus_extra

__all__ = ["JSONL_ZSTD", "CutStreamError", "StreamError", "WindowError", "ZstdReader"]


#: Compressed bytes read from the file at a time.
RAW_READ_BYTES = 1 << 17
#: Compressed bytes given to the decompressor per call. A zstd block of 128 KiB can be 4 bytes (an RLE
#: block), so one call returns at most about FEED_BYTES x 32 Ki = 8 MiB: a bomb never lands in memory whole.
FEED_BYTES = 256
#: Decompressed bytes gathered per fill (at most one call's output more).
FILL_BYTES = 1 << 20
#: The largest zstd window decoded (zstandard's and the zstd CLI's default limit): a frame's window is
#: held in memory beside the line cap, so a stream costs at most about the cap + this + 8 MiB.
MAX_WINDOW = 1 << 27


class ZstdReader(io.RawIOBase):
    """Decompressed bytes of a zstd file (every frame in turn); a cut or corrupt stream raises ``StreamError``.

    Why not zstandard's ``stream_reader``: at the end of a truncated file it simply stops, so a
    cut download would read as a shorter, complete input. The output is bounded whatever the input
    (see :data:`FEED_BYTES`): a line cap is enforced while the stream is read, not after a bomb expands.
    """

    def __init__(self, raw: Any) -> None:
        zstd = require_corpus_extra("zstandard", JSONL_ZSTD)
        self._raw = raw
        self._raw_read_bytes, self._feed_bytes, self._fill_bytes = RAW_READ_BYTES, FEED_BYTES, FILL_BYTES
        self._context = zstd.ZstdDecompressor()  # type: ignore[attr-defined]
        self._zstd_error = zstd.ZstdError  # type: ignore[attr-defined]
        self._frame = self._context.decompressobj()
        self._in_frame = False
        self._pending = memoryview(b"")  # compressed bytes read, not yet given to the decompressor
        self._buffer = memoryview(b"")
        self._position = 0

    def readable(self) -> bool:
        return True

    def _fill(self) -> bool:
        while self._position >= len(self._buffer):
            if not self._pending:
                data = self._raw.read(self._raw_read_bytes)
                if not data:
                    if self._in_frame:
                        raise CutStreamError("the stream ends inside a zstd frame (the file is cut short)")
                    return False
                self._pending = memoryview(data)
            out: list[bytes] = []
            size = 0
            try:  # a few compressed bytes at a time: no call can return more than FEED_BYTES expand to
                while self._pending and size < self._fill_bytes:
                    data, self._pending = self._pending[: self._feed_bytes], self._pending[self._feed_bytes :]
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
                if "too much memory" in str(exc):  # a valid frame made with zstd --long=28 or more
                    raise WindowError(
                        f"a zstd frame needs a decoding window over {MAX_WINDOW >> 20} MiB, the most zstd decodes "
                        "by default"
                    ) from None
                raise StreamError(f"the zstd data is corrupt ({exc})") from None
            self._buffer, self._position = memoryview(out[0] if len(out) == 1 else b"".join(out)), 0
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


class CutStreamError(StreamError):
    """A stream that ends inside a zstd frame: the file was cut short."""


class WindowError(StreamError):
    """A valid zstd frame whose window is over :data:`MAX_WINDOW` (not a cut or corrupt file)."""


class _ZstdJsonl(InputReader):
    name = "zstd-compressed jsonl"
    suffixes = (".jsonl.zst", ".jsonl.zstd", ".json.zst", ".json.zstd")
    magic = (b"\x28\xb5\x2f\xfd",)
    stream_name = "zstd"
    stream_errors = (StreamError,)

    def open(self, source: Any, **options: Any) -> Any:
        return io.BufferedReader(ZstdReader(source), 1 << 16)


JSONL_ZSTD = register(_ZstdJsonl())
