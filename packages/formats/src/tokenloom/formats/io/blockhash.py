"""Block hashes: an xxh3-64 per fixed-size block of a data file, recorded in the manifest.

A manifest's file entry may carry ``block_size`` and ``block_xxh3_64`` (16 hex digits per block, the blocks
in order, the last one short). They let a reader of a remote copy verify each block it fetches, and each
cached block the first time a process maps it, without reading the whole file.

The hash block size is :data:`HASH_BLOCK_SIZE` (1 MiB). The remote cache's default block (8 MiB) and any
cache block that is a multiple of 1 MiB is verified by the hash blocks it covers (an aligned cache block
covers whole hash blocks, the file's last one possibly short); a cache block that is not a multiple of the
recorded hash block cannot be checked alone, and the reader says so once, at open. 1 MiB costs 16 bytes of
manifest per MiB of data (16 MB for 1 TB).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import xxhash

from tokenloom.formats.errors import FormatError

__all__ = ["HASH_BLOCK_SIZE", "BlockHashes", "file_digests", "hash_blocks"]

#: bytes per hashed block of a data file (the manifest records the size it used)
HASH_BLOCK_SIZE = 1 << 20
_HEX = re.compile(r"[0-9a-f]*")


@dataclass(frozen=True, slots=True)
class BlockHashes:
    """The xxh3-64 of every ``block_size`` bytes of one file, as one hex string (16 digits per block)."""

    block_size: int
    digests: str

    def __len__(self) -> int:
        return len(self.digests) // 16

    def digest(self, number: int) -> str:
        return self.digests[16 * number : 16 * number + 16]

    def covers(self, size: int) -> bool:
        """True when the hashes are exactly those of a file of ``size`` bytes (one per block)."""
        return len(self.digests) == 16 * -(-size // self.block_size)

    def mismatch(self, data: Any, offset: int) -> tuple[int, str, str] | None:
        """``(first byte, expected, actual)`` of the first hash block of ``data`` (at byte ``offset`` of the
        file; both aligned to ``block_size``) whose hash differs, else None."""
        view = memoryview(data).cast("B")
        size = self.block_size
        for inside in range(0, len(view), size):
            actual = xxhash.xxh3_64(view[inside : inside + size]).hexdigest()
            expected = self.digest((offset + inside) // size)
            if actual != expected:
                return offset + inside, expected, actual
        return None

    def to_json(self) -> dict[str, Any]:
        return {"block_size": self.block_size, "block_xxh3_64": self.digests}

    @classmethod
    def from_json(cls, item: dict[str, Any], size: int, *, path: Any, record: int) -> BlockHashes | None:
        """The hashes of a manifest file entry (None when it records none; FormatError when they are malformed)."""
        if "block_size" not in item and "block_xxh3_64" not in item:
            return None
        block_size, digests = item.get("block_size"), item.get("block_xxh3_64")
        hint = "The manifest was edited or damaged; rewrite it with `tokenloom validate --write-manifest`"
        if type(block_size) is not int or block_size <= 0 or block_size % 4096:
            raise FormatError(
                f"block_size {block_size!r} is not a positive multiple of 4096",
                path=path,
                record=record,
                field="files.block_size",
                hint=hint,
            )
        hashes = cls(block_size, digests) if type(digests) is str else None
        if hashes is None or not hashes.covers(size) or not _HEX.fullmatch(hashes.digests):
            raise FormatError(
                f"block_xxh3_64 is not {-(-size // block_size)} hex hashes of 16 digits for {size} bytes",
                path=path,
                record=record,
                field="files.block_xxh3_64",
                hint=hint,
            )
        return hashes


def hash_blocks(data: Any, block_size: int = HASH_BLOCK_SIZE) -> str:
    """The hex xxh3-64 of every ``block_size`` bytes of ``data``, concatenated."""
    view = memoryview(data).cast("B")
    return "".join(xxhash.xxh3_64(view[i : i + block_size]).hexdigest() for i in range(0, len(view), block_size))


def file_digests(path: str | os.PathLike[str], block_size: int = HASH_BLOCK_SIZE) -> tuple[str, BlockHashes]:
    """(xxh3-128 of the whole file, its :class:`BlockHashes`), in one pass through one reused buffer."""
    whole = xxhash.xxh3_128()
    blocks: list[str] = []
    buffer = bytearray(block_size)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while True:
            count = 0
            while count < block_size and (got := handle.readinto(view[count:])):
                count += got
            if not count:
                break
            whole.update(view[:count])
            blocks.append(xxhash.xxh3_64(view[:count]).hexdigest())
            if count < block_size:
                break
    return whole.hexdigest(), BlockHashes(block_size, "".join(blocks))
