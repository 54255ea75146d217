"""The native format: GPT-Simple's ``.bin`` + ``.idx`` shard pairs, plus a manifest.

``.bin``: the tokens of every entry, concatenated, little-endian, of the dtype
named in the ``.idx`` header. ``.idx``: GPT-Simple's byte layout exactly (see
:mod:`tokenloom.formats.native.layout`): magic ``GPTS``, uint32 version 1, uint32 dtype
code (2 uint16, 4 uint32), uint32 entry count n, int64 offsets (n + 1), uint16
overlap-prefix lengths (n).

A dataset directory written by tokenloom holds ``shard_NNNNN.bin`` / ``.idx``
pairs and ``manifest.json`` (written last). While a writer runs, the marker
``.tokenloom-writing`` exists; a reader refuses a directory that has it.

A directory without a manifest (GPT-Simple's pretokenize output, e.g.
``data/tokenized/train/<bucket>/``) opens with the same fast validation: every
``.idx`` header, the file sizes, offsets that start at 0, never decrease and end
at the ``.bin``'s token count, and overlap prefixes no longer than their entries,
all without reading a token. ``adopt_native`` (``tokenloom validate
--write-manifest DIR``) writes a manifest for it, after which every open also
checks sizes and index checksums.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from tokenloom.formats._contract import Validate
from tokenloom.formats._writer import ShardedWriter
from tokenloom.formats.errors import ConfigError
from tokenloom.formats.io import EOS_AT_DOCUMENT_END, EOS_PLACEMENT
from tokenloom.formats.io.atomic import TempFile, atomic_write_bytes, fsync_dir
from tokenloom.formats.io.manifest import MANIFEST_NAME, Manifest, describe_files, write_manifest
from tokenloom.formats.io.output import shard_cut
from tokenloom.formats.native.layout import (
    EXTENSION_CODES,
    MAX_ENTRIES,
    MAX_OVERLAP_KEY,
    NATIVE_MAGIC,
    pack_header,
)
from tokenloom.formats.native.reader import NATIVE_MANIFEST_VERSION, open_native

__all__ = ["NATIVE_MAGIC", "adopt_native", "NativeShardWriter", "NativeWriter"]

log = logging.getLogger("tokenloom.formats")


_COMPACT_EVERY = 4096


class NativeShardWriter:
    """Writes one ``stem.bin`` / ``stem.idx`` pair; both appear only on ``close``.

    The .bin is published before the .idx, so a crash between the two leaves a
    .bin without .idx, which readers reject (MissingFileError) and writers overwrite.
    """

    def __init__(self, directory: Path, stem: str, dtype: np.dtype) -> None:
        self.directory = directory
        self.stem = stem
        self.dtype = dtype
        self.bin_path = directory / f"{stem}.bin"
        self.idx_path = directory / f"{stem}.idx"
        self._bin = TempFile(self.bin_path)
        self._lengths: list[np.ndarray] = []
        self._overlaps: list[np.ndarray] = []
        self.num_tokens = 0
        self.num_entries = 0  # kept as a count: add() per entry must stay O(1), not O(entries so far)

    def write(self, tokens: np.ndarray, lengths: np.ndarray, overlaps: np.ndarray) -> None:
        # the array's own buffer, not a tobytes() copy: the write is the only pass over the tokens here
        self._bin.handle.write(np.ascontiguousarray(tokens, dtype=self.dtype.newbyteorder("<")).data)
        self._lengths.append(lengths.astype(np.int64))
        self._overlaps.append(overlaps.astype("<u2"))
        self.num_tokens += len(tokens)
        self.num_entries += len(lengths)
        if len(self._lengths) >= _COMPACT_EVERY:  # one small array per add() would cost ~100 bytes each
            self._lengths = [np.concatenate(self._lengths)]
            self._overlaps = [np.concatenate(self._overlaps)]

    def close(self) -> None:
        self._bin.finish()
        lengths = np.concatenate(self._lengths) if self._lengths else np.empty(0, np.int64)
        if len(lengths) > MAX_ENTRIES:
            self.abort()
            raise ConfigError(
                f"shard {self.stem} holds {len(lengths)} entries, GPT-Simple's .idx counts at most {MAX_ENTRIES}",
                path=self.directory,
                hint="Use a smaller shard size",
            )
        overlaps = np.concatenate(self._overlaps) if self._overlaps else np.empty(0, "<u2")
        offsets = np.zeros(len(lengths) + 1, dtype="<i8")
        np.cumsum(lengths, out=offsets[1:])
        header = pack_header(self.dtype, len(lengths))
        self._bin.publish(sync_dir=False)  # the .idx's atomic write fsyncs the directory after both renames
        atomic_write_bytes(self.idx_path, header + offsets.tobytes() + overlaps.astype("<u2").tobytes())

    def abort(self) -> None:
        self._bin.abort()


class NativeWriter(ShardedWriter):
    """A native dataset directory: shards ``shard_NNNNN.bin`` / ``.idx`` of about ``shard_size_tokens`` tokens,
    manifest last (the arguments: :class:`~tokenloom.formats._writer.ShardedWriter`)."""

    format = "native"
    #: GPT-Simple's entry count is a uint32: a shard that reaches it is closed and the next one begun.
    max_entries_per_shard = MAX_ENTRIES

    _max_overlap = 0

    def _open_shard(self, number: int) -> NativeShardWriter:
        if number == 0 and self.dtype.name not in ("uint16", "uint32"):
            codes = {name: f"{code:#x}" for code, name in EXTENSION_CODES.items()}
            log.warning(
                "native %s shards use tokenloom extension dtype code %s: GPT-Simple reads only uint16 and "
                "uint32 shards (it would read these as uint32)",
                self.dtype.name,
                codes[self.dtype.name],
            )
        self._names.append(f"shard_{number:05d}")
        return NativeShardWriter(self.path, self._names[-1], self.dtype)

    def _written(self) -> list[str]:
        return [f"{stem}{suffix}" for stem in self._names for suffix in (".bin", ".idx")]

    def _write_batch(self, tokens: np.ndarray, lengths: np.ndarray, overlaps: np.ndarray) -> None:
        if len(overlaps):
            self._max_overlap = max(self._max_overlap, int(overlaps.max()))
        ends = np.cumsum(lengths)
        shard_size = self.shard_size_tokens if self.shard_size_tokens is not None else 1 << 62
        begin_entry = 0
        while begin_entry < len(lengths):
            shard = self._shard()
            base = int(ends[begin_entry - 1]) if begin_entry else 0
            stop = shard_cut(ends, begin_entry, shard.num_tokens, shard_size)
            stop = min(stop, begin_entry + self.max_entries_per_shard - shard.num_entries)
            shard.write(tokens[base : int(ends[stop - 1])], lengths[begin_entry:stop], overlaps[begin_entry:stop])
            begin_entry = stop
            if shard.num_tokens >= shard_size or shard.num_entries >= self.max_entries_per_shard:
                self._finish_shard()

    def _commit(self) -> None:
        if self._current is None and not self._names:
            self._shard()  # an empty dataset still has one (empty) shard
        self._finish_shard()
        names = []
        for stem in self._names:
            names += [(f"{stem}.idx", "index"), (f"{stem}.bin", "data")]
        self._publish_manifest(
            names,
            # a reader of a remote copy then knows every overlap prefix is 0 without fetching each shard's .idx
            metadata={MAX_OVERLAP_KEY: self._max_overlap},
            version=NATIVE_MANIFEST_VERSION,
        )


def adopt_native(
    path: str | os.PathLike[str],
    *,
    vocab_size: int | None = None,
    eos_id: int | None = None,
    tokenizer_fingerprint: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> Manifest:
    """Write ``manifest.json`` for a manifest-less native directory (GPT-Simple's pretokenize output).

    The shards are validated structurally, token ids are checked against
    ``vocab_size`` when given, and every file is checksummed, so later opens verify
    integrity. EOS placement is not checked, now or by later deep validation (the
    metadata records ``eos_placement: document_end``: GPT-Simple ends only the windows
    that reach a document's end with EOD); pass ``eos_id`` only if it is the EOD id of
    that tokenizer.
    """
    root = Path(path)
    if (root / MANIFEST_NAME).exists():
        raise ConfigError(f"{root} already has a {MANIFEST_NAME}", path=root / MANIFEST_NAME, hint="Nothing to adopt")
    dataset = open_native(root, validate=Validate.FAST)
    dataset.vocab_size = vocab_size
    dataset.check_token_range()
    names = []
    for shard in dataset.shards:
        names += [(f"{shard.name}.idx", "index"), (f"{shard.name}.bin", "data")]
    manifest = Manifest(
        version=NATIVE_MANIFEST_VERSION,
        format="native",
        dtype=dataset.dtype.name,
        num_tokens=dataset.num_tokens,
        num_documents=len(dataset),
        files=describe_files(root, names),
        vocab_size=vocab_size,
        eos_id=eos_id,
        tokenizer_fingerprint=tokenizer_fingerprint,
        metadata={"adopted": True, EOS_PLACEMENT: EOS_AT_DOCUMENT_END, **(metadata or {})},
    )
    written = write_manifest(root, manifest)
    fsync_dir(root)
    return written
