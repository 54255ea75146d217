"""The wire format: one fixed int64 header, then a bounded message or the rows in chunks.

    header  int64[12]  magic, version, status, rows, row_len, dtype code, checksum (xxh3-64 as int64),
                       message length, tail padding, eos id (-1: none), vocab size (-1: none), chunk bytes
    status BUILDING    nothing follows; another header comes (a heartbeat while the source builds)
    status FAILED      uint8[message length]: the source's error, UTF-8, at most MAX_MESSAGE_BYTES
    status MAPPED      uint8[message length]: the cache entry's name under cache_dir; every rank maps it
    status OK          uint8[rows * row_len * width] in ceil(bytes / chunk bytes) chunks of <= chunk bytes

No pickled objects ever cross the wire.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from enum import IntEnum

import numpy as np

__all__ = ["HEADER_LEN", "MAGIC", "MAX_MESSAGE_BYTES", "VERSION", "Header", "Status", "encode_message"]

MAGIC = int.from_bytes(b"TLEVAL01", "big")
VERSION = 1
MAX_MESSAGE_BYTES = 4096
HEADER_LEN = 12
_U64 = 1 << 64


class Status(IntEnum):
    OK = 0
    FAILED = 1
    BUILDING = 2
    MAPPED = 3


@dataclass(frozen=True, slots=True)
class Header:
    """The fields in their wire order, after the magic and the version; None travels as -1."""

    status: Status
    rows: int = 0
    row_len: int = 0
    dtype_code: int = 0
    checksum: int = 0
    """Unsigned xxh3-64 of the rows' bytes."""
    message_len: int = 0
    tail_padding: int = 0
    eos_id: int | None = None
    vocab_size: int | None = None
    chunk_bytes: int = 0

    def encode(self) -> np.ndarray:
        values = [MAGIC, VERSION, *(-1 if v is None else int(v) for v in astuple(self))]
        if values[6] >= 1 << 63:  # the unsigned checksum as a signed int64
            values[6] -= _U64
        return np.array(values, dtype=np.int64)

    @classmethod
    def decode(cls, values: np.ndarray) -> Header:
        """The header, or ValueError naming the field that makes no sense."""
        v = [int(x) for x in values]
        if v[0] != MAGIC or v[1] != VERSION:
            raise ValueError(f"header magic/version {v[0]:#x}/{v[1]}, expected {MAGIC:#x}/{VERSION}")
        try:
            status = Status(v[2])
        except ValueError:
            raise ValueError(f"header status {v[2]} is unknown") from None
        if min(v[3], v[4], v[7], v[8], v[11]) < 0 or v[7] > MAX_MESSAGE_BYTES:
            raise ValueError(f"header sizes out of range: {v}")
        rows, row_len, dtype_code, checksum, message_len, tail_padding, eos_id, vocab_size, chunk = v[3:]
        eos, vocab = (None if x < 0 else x for x in (eos_id, vocab_size))
        return cls(status, rows, row_len, dtype_code, checksum % _U64, message_len, tail_padding, eos, vocab, chunk)


def encode_message(text: str) -> bytes:
    """UTF-8, cut at MAX_MESSAGE_BYTES on a character boundary."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= MAX_MESSAGE_BYTES:
        return data
    marker = b" [...]"
    return data[: MAX_MESSAGE_BYTES - len(marker)].decode("utf-8", errors="ignore").encode() + marker
