"""Cutting a unit's entry stream into native shards, one closed shard at a time.

The cut rule is the formats package's ``shard_cut`` (the one NativeWriter uses): a
shard is closed once it holds at least ``shard_size_tokens`` tokens; entries are
never split. It depends only on the entry stream, so a unit's shards are the same
however its input is cut into chunks. Each closed shard's record is kept in ``records``
(for the unit's done marker).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tokenloom.formats.io import BlockHashes, FileEntry, file_digests, shard_cut
from tokenloom.formats.native import NativeShardWriter

__all__ = ["ShardCutter", "ShardRecord"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardRecord:
    """A published shard: its files' sizes and checksums, and its counts."""

    index: int
    num_tokens: int
    num_entries: int
    #: the ``.bin``'s block hashes (records of runs before wave 4 have none)
    bin_blocks: BlockHashes | None = None
    bin_bytes: int
    bin_xxh3_128: str
    #: the ``.idx``'s block hashes: a reader checks the index blocks it touches, so a fresh open reads no
    #: whole index (records of earlier runs have none: those outputs open with the full index scan)
    idx_blocks: BlockHashes | None = None
    idx_bytes: int
    idx_xxh3_128: str

    def to_json(self) -> dict[str, object]:
        blocks = {}
        for prefix, hashes in (("bin_", self.bin_blocks), ("idx_", self.idx_blocks)):
            if hashes is not None:
                blocks.update({prefix + k: v for k, v in hashes.to_json().items()})
        return {
            **blocks,
            "index": self.index,
            "num_tokens": self.num_tokens,
            "num_entries": self.num_entries,
            "bin_bytes": self.bin_bytes,
            "bin_xxh3_128": self.bin_xxh3_128,
            "idx_bytes": self.idx_bytes,
            "idx_xxh3_128": self.idx_xxh3_128,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> ShardRecord:
        found = {name: data[name] for name in cls.__slots__ if name not in ("bin_blocks", "idx_blocks")}
        for prefix in ("bin_", "idx_"):
            if f"{prefix}block_size" in data:
                hashes = BlockHashes(int(data[f"{prefix}block_size"]), str(data[f"{prefix}block_xxh3_64"]))  # type: ignore[arg-type]
                found[f"{prefix}blocks"] = hashes
        return cls(**found)  # type: ignore[arg-type]

    def entries(self, stem: str) -> tuple[FileEntry, FileEntry]:
        """The manifest entries of this shard's ``.idx`` and ``.bin``."""
        return (
            FileEntry(f"{stem}.idx", self.idx_bytes, self.idx_xxh3_128, "index", self.idx_blocks),
            FileEntry(f"{stem}.bin", self.bin_bytes, self.bin_xxh3_128, "data", self.bin_blocks),
        )


class ShardCutter:
    """Feeds entries into shard writers, closing each at the size target."""

    def __init__(
        self,
        directory: Path,
        *,
        dtype: np.dtype,
        shard_size_tokens: int,
        stem: Callable[[int], str],
    ) -> None:
        self.directory = directory
        self.dtype = dtype
        self.shard_size_tokens = shard_size_tokens
        self.stem = stem
        self.records: list[ShardRecord] = []
        self._current: NativeShardWriter | None = None

    def _writer(self) -> NativeShardWriter:
        if self._current is None:
            self._current = NativeShardWriter(self.directory, self.stem(len(self.records)), self.dtype)
        return self._current

    def _close(self) -> None:
        writer = self._current
        if writer is None:
            return
        num_entries = writer.num_entries
        writer.close()
        self._current = None
        bin_checksum, bin_blocks = file_digests(writer.bin_path)
        idx_checksum, idx_blocks = file_digests(writer.idx_path)
        record = ShardRecord(
            index=len(self.records),
            num_tokens=writer.num_tokens,
            num_entries=num_entries,
            bin_bytes=writer.bin_path.stat().st_size,
            bin_xxh3_128=bin_checksum,
            bin_blocks=bin_blocks,
            idx_bytes=writer.idx_path.stat().st_size,
            idx_xxh3_128=idx_checksum,
            idx_blocks=idx_blocks,
        )
        self.records.append(record)

    def feed(
        self, tokens: npt.NDArray[np.integer], lengths: npt.NDArray[np.int64], overlap_prefix: npt.NDArray[np.uint16]
    ) -> None:
        """Append one chunk's entries."""
        ends = np.cumsum(lengths)
        begin = 0
        while begin < len(lengths):
            writer = self._writer()
            base = int(ends[begin - 1]) if begin else 0
            stop = shard_cut(ends, begin, writer.num_tokens, self.shard_size_tokens)
            writer.write(tokens[base : int(ends[stop - 1])], lengths[begin:stop], overlap_prefix[begin:stop])
            begin = stop
            if writer.num_tokens >= self.shard_size_tokens:
                self._close()

    def finish(self) -> None:
        """Close the last (partial) shard; an empty one if the unit has none."""
        if self._current is None and not self.records:
            self._writer()
        self._close()

    def abort(self) -> None:
        if self._current is not None:
            self._current.abort()
            self._current = None
