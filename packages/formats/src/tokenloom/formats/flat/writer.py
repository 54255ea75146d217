"""Writing flat datasets: ``FlatWriter`` (the layout: ``reader.py``'s docstring)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Unpack

import numpy as np

from tokenloom.formats._writer import ShardedWriter, WriterBasics
from tokenloom.formats.errors import ConfigError
from tokenloom.formats.flat.npy import npy_header
from tokenloom.formats.flat.reader import DOCUMENT_LENGTHS_NAME
from tokenloom.formats.io.atomic import TempFile, atomic_write_bytes, fsync_dir
from tokenloom.formats.io.output import shard_cut

__all__ = ["FILE_FORMATS", "FlatWriter"]

#: The shard file formats the writer takes (``file_format=``): self-describing .npy, raw .bin
FILE_FORMATS = ("npy", "bin")


class _ShardFile(TempFile):
    """One shard streamed to a temp name and published under its name by ``finish`` (``.npy``: its header
    rewritten with the final count first)."""

    def __init__(self, path: Path, dtype: np.dtype, *, npy: bool) -> None:
        super().__init__(path)
        self.dtype = dtype
        self.npy = npy
        self.num_tokens = 0
        self.num_entries = 0
        if npy:
            self.handle.write(npy_header(dtype, 0))

    def write(self, tokens: np.ndarray) -> None:
        self.handle.write(np.ascontiguousarray(tokens, dtype=self.dtype).data)
        self.num_tokens += len(tokens)

    def close(self) -> None:
        if self.npy:
            self.handle.seek(0)
            self.handle.write(npy_header(self.dtype, self.num_tokens))
        self.publish(sync_dir=False)  # the commit fsyncs the directory


class FlatWriter(ShardedWriter):
    """Flat shards ``{file_prefix}_NNNNN.npy`` (or ``.bin``) of about ``shard_size_tokens`` tokens, manifest last.

    Documents are concatenated and never split across shards. Flat shards cannot
    hold overlap prefixes: a non-zero one is a ConfigError. See the module
    docstring for how document boundaries survive.

    Args:
        path: the dataset directory (created; must be empty unless ``overwrite``).
        shard_size_tokens: start a new shard once a shard holds at least this many tokens. None: one shard.
        file_format: ``"npy"`` (self-describing) or ``"bin"`` (raw; the dtype lives in the manifest).
        file_prefix: shard names start with this.
        tokenizer_fingerprint, metadata: as :class:`~tokenloom.formats._writer.ShardedWriter`.
    """

    format = "flat"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        shard_size_tokens: int | None = None,
        file_format: str = "npy",
        file_prefix: str = "shard",
        tokenizer_fingerprint: str | None = None,
        metadata: dict[str, Any] | None = None,
        overwrite: bool = False,
        **basics: Unpack[WriterBasics],
    ) -> None:
        if file_format not in FILE_FORMATS:
            raise ConfigError(f"file_format={file_format!r}, expected 'npy' or 'bin'", field="file_format")
        if not file_prefix or any(ch in file_prefix for ch in "/\\*?[") or file_prefix.startswith("."):
            raise ConfigError(f"file_prefix {file_prefix!r} must be a plain file-name prefix", field="file_prefix")
        self.file_format = file_format
        self.file_prefix = file_prefix
        super().__init__(
            path,
            shard_size_tokens=shard_size_tokens,
            tokenizer_fingerprint=tokenizer_fingerprint,
            metadata=metadata,
            overwrite=overwrite,
            **basics,
        )
        self._lengths: list[np.ndarray] = []
        self._shards: list[_ShardFile] = []
        self._pending_entries = 0

    @property
    def file_pattern(self) -> str:
        return f"{self.file_prefix}_*.{self.file_format}"

    def _write_batch(self, tokens: np.ndarray, lengths: np.ndarray, overlaps: np.ndarray) -> None:
        self._refuse_overlaps(overlaps, "flat shards")
        self._lengths.append(lengths.astype("<i8"))
        ends = np.cumsum(lengths)
        starts = ends - lengths
        first = 0  # the first entry of this batch not yet given to a shard
        while first < len(lengths):
            base = int(starts[first])
            if base == len(tokens):  # only empty entries remain: they join the open shard, or the next one
                self._assign(len(lengths) - first)
                break
            shard = self._shard()
            if self.shard_size_tokens is None:
                stop = len(lengths)
            else:
                stop = shard_cut(ends, first, shard.num_tokens, self.shard_size_tokens)
            token_end = int(ends[stop - 1])
            shard.write(tokens[base:token_end])
            shard.num_entries += stop - first
            first = stop
            if self.shard_size_tokens is not None and shard.num_tokens >= self.shard_size_tokens:
                self._finish_shard()

    def _assign(self, count: int) -> None:
        if self._current is not None:
            self._current.num_entries += count
        else:
            self._pending_entries += count

    def _open_shard(self, number: int) -> _ShardFile:
        self._names.append(f"{self.file_prefix}_{number:05d}.{self.file_format}")
        shard = _ShardFile(self.path / self._names[-1], self.dtype, npy=self.file_format == "npy")
        shard.num_entries, self._pending_entries = self._pending_entries, 0
        self._shards.append(shard)
        return shard

    def _written(self) -> list[str]:
        return [*self._names, DOCUMENT_LENGTHS_NAME]

    def _commit(self) -> None:
        if self.num_tokens == 0:
            self._abort()
            raise ConfigError(
                "no tokens were written: flat shards cannot hold an empty dataset",
                path=self.path,
                hint="Write at least one non-empty document, or use the native format",
            )
        self._finish_shard()
        shard_entries = [shard.num_entries for shard in self._shards]
        shard_entries[-1] += self._pending_entries  # trailing empty documents join the last shard
        lengths = np.concatenate(self._lengths) if self._lengths else np.empty(0, "<i8")
        atomic_write_bytes(self.path / DOCUMENT_LENGTHS_NAME, lengths.astype("<i8").tobytes())
        fsync_dir(self.path)
        files = [(name, "data") for name in self._names] + [(DOCUMENT_LENGTHS_NAME, "index")]
        self._publish_manifest(
            files,
            metadata={
                "flat": {
                    "file_pattern": self.file_pattern,
                    "document_boundaries": "lengths",
                    "shard_entries": shard_entries,
                },
            },
        )
