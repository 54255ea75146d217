"""The native format: GPT-Simple's ``.bin`` + ``.idx`` shard pairs, plus a manifest.

``.bin``: the tokens of every entry, concatenated, little-endian, of the dtype
named in the ``.idx`` header. ``.idx``: GPT-Simple's byte layout exactly (see
:mod:`tokenloom.formats._gpts`): magic ``GPTS``, uint32 version 1, uint32 dtype
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

import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from tokenloom.formats._atomic import WRITING_MARKER, atomic_write_bytes, fsync_dir, temp_path
from tokenloom.formats._dataset import EOS_AT_DOCUMENT_END, EOS_PLACEMENT, Shard, TokenDataset
from tokenloom.formats._dtypes import as_token_dtype
from tokenloom.formats._gpts import (
    EXTENSION_CODES,
    LEGACY_CONVERT_HINT,
    MAX_ENTRIES,
    NATIVE_MAGIC,
    pack_header,
    parse_header,
)
from tokenloom.formats._gpts import HEADER as _HEADER
from tokenloom.formats._manifest import (
    MANIFEST_NAME,
    Manifest,
    describe_files,
    read_manifest,
    write_manifest,
)
from tokenloom.formats._paths import safe_file, safe_stat
from tokenloom.formats._safety import check_replaceable
from tokenloom.formats._writer import TokenWriter
from tokenloom.formats.errors import (
    ConfigError,
    FormatError,
    IndexCorruptError,
    MissingFileError,
    TruncatedError,
)

__all__ = [
    "NATIVE_MAGIC",
    "adopt_native",
    "WRITING_MARKER",
    "NativeShardWriter",
    "NativeWriter",
    "is_native",
    "open_native",
    "read_native_shard",
    "shard_cut",
]

log = logging.getLogger("tokenloom.formats")

#: the manifest version whose native shards are in GPT-Simple's layout (1: tokenloom's pre-release layout)
NATIVE_MANIFEST_VERSION = 2


def shard_cut(ends: np.ndarray, begin: int, filled: int, shard_size_tokens: int) -> int:
    """Where the entries from ``begin`` stop going into a shard that already holds ``filled`` tokens.

    ``ends`` is the cumulative token count of a batch's entries. Whole entries are
    taken until the shard holds at least ``shard_size_tokens`` (the entry crossing
    the target stays in it), and at least one. Every writer that shards by size
    uses this one rule, so shard files are the same however entries are batched.
    """
    base = int(ends[begin - 1]) if begin else 0
    stop = int(np.searchsorted(ends, base + shard_size_tokens - filled, side="left")) + 1
    return max(begin + 1, min(stop, len(ends)))


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
        self._bin_tmp = temp_path(self.bin_path)
        self._handle = open(self._bin_tmp, "wb")  # noqa: SIM115 - closed in close/abort
        self._lengths: list[np.ndarray] = []
        self._overlaps: list[np.ndarray] = []
        self.num_tokens = 0
        self.num_entries = 0  # kept as a count: add() per entry must stay O(1), not O(entries so far)

    def write(self, tokens: np.ndarray, lengths: np.ndarray, overlaps: np.ndarray) -> None:
        self._handle.write(np.ascontiguousarray(tokens, dtype=self.dtype.newbyteorder("<")).tobytes())
        self._lengths.append(lengths.astype(np.int64))
        self._overlaps.append(overlaps.astype("<u2"))
        self.num_tokens += len(tokens)
        self.num_entries += len(lengths)
        if len(self._lengths) >= _COMPACT_EVERY:  # one small array per add() would cost ~100 bytes each
            self._lengths = [np.concatenate(self._lengths)]
            self._overlaps = [np.concatenate(self._overlaps)]

    def close(self) -> None:
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()
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
        os.replace(self._bin_tmp, self.bin_path)
        atomic_write_bytes(self.idx_path, header + offsets.tobytes() + overlaps.astype("<u2").tobytes())
        fsync_dir(self.directory)

    def abort(self) -> None:
        self._handle.close()
        with contextlib.suppress(FileNotFoundError):
            self._bin_tmp.unlink()


class NativeWriter(TokenWriter):
    """A native dataset directory: shards of about ``shard_size_tokens`` tokens, manifest last.

    Args:
        path: the dataset directory (created; must be empty unless ``overwrite``).
        shard_size_tokens: start a new shard once a shard holds at least this many
            tokens (entries are never split across shards). None: one shard.
        tokenizer_fingerprint: recorded in the manifest, checked by resumes.
        metadata: settings that produced the data, recorded in the manifest.
    """

    format = "native"
    #: GPT-Simple's entry count is a uint32: a shard that reaches it is closed and the next one begun.
    max_entries_per_shard = MAX_ENTRIES

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        dtype: Any,
        vocab_size: int | None = None,
        eos_id: int | None = None,
        shard_size_tokens: int | None = None,
        tokenizer_fingerprint: str | None = None,
        metadata: dict[str, Any] | None = None,
        overwrite: bool = False,
    ) -> None:
        super().__init__(path, dtype=dtype, vocab_size=vocab_size, eos_id=eos_id)
        if shard_size_tokens is not None and shard_size_tokens < 1:
            raise ConfigError(f"shard_size_tokens is {shard_size_tokens}, expected >= 1", field="shard_size_tokens")
        self.shard_size_tokens = shard_size_tokens
        self.tokenizer_fingerprint = tokenizer_fingerprint
        self.metadata = dict(metadata or {})
        if self.dtype.name not in ("uint16", "uint32"):
            codes = {name: f"{code:#x}" for code, name in EXTENSION_CODES.items()}
            log.warning(
                "native %s shards use tokenloom extension dtype code %s: GPT-Simple reads only uint16 and "
                "uint32 shards (it would read these as uint32)",
                self.dtype.name,
                codes[self.dtype.name],
            )
        prepare_output_dir(self.path, overwrite=overwrite)
        (self.path / WRITING_MARKER).write_bytes(b"")
        fsync_dir(self.path)
        self._stems: list[str] = []
        self._current: NativeShardWriter | None = None

    def _shard(self) -> NativeShardWriter:
        if self._current is None:
            stem = f"shard_{len(self._stems):05d}"
            self._current = NativeShardWriter(self.path, stem, self.dtype)
            self._stems.append(stem)
        return self._current

    def _finish_shard(self) -> None:
        if self._current is not None:
            self._current.close()
            self._current = None

    def _write_batch(self, tokens: np.ndarray, lengths: np.ndarray, overlaps: np.ndarray) -> None:
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
        if self._current is None and not self._stems:
            self._shard()  # an empty dataset still has one (empty) shard
        self._finish_shard()
        names = []
        for stem in self._stems:
            names += [(f"{stem}.idx", "index"), (f"{stem}.bin", "data")]
        manifest = Manifest(
            version=NATIVE_MANIFEST_VERSION,
            format="native",
            dtype=self.dtype.name,
            num_tokens=self.num_tokens,
            num_documents=self.num_documents,
            files=describe_files(self.path, names),
            vocab_size=self.vocab_size,
            eos_id=self.eos_id,
            tokenizer_fingerprint=self.tokenizer_fingerprint,
            metadata=self.metadata,
        )
        write_manifest(self.path, manifest)
        (self.path / WRITING_MARKER).unlink()
        fsync_dir(self.path)

    def _abort(self) -> None:
        if self._current is not None:
            self._current.abort()
            self._current = None
        for stem in self._stems:
            for suffix in (".bin", ".idx"):
                with contextlib.suppress(FileNotFoundError):
                    (self.path / f"{stem}{suffix}").unlink()
        with contextlib.suppress(FileNotFoundError):
            (self.path / WRITING_MARKER).unlink()


_COMPLETION_FILES = (MANIFEST_NAME, "meta.json")  # the files whose presence means "complete"


def prepare_output_dir(path: Path, *, overwrite: bool, ours: Callable[[str], bool] | None = None) -> None:
    """Create ``path``; refuse a non-empty one unless ``overwrite`` (then clear its files).

    Only tokenloom output (or files ``ours`` accepts) is ever cleared: see ``_safety.check_replaceable``.
    """
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{path} exists and is not a directory", path=path)
    path.mkdir(parents=True, exist_ok=True)
    existing = [p for p in path.iterdir()]
    if existing and not overwrite:
        raise ConfigError(
            f"output directory is not empty ({len(existing)} entries)",
            path=path,
            hint="Choose an empty directory or pass --overwrite (overwrite=True)",
        )
    check_replaceable(path, ours)
    for entry in existing:
        if entry.is_dir() and not entry.is_symlink():
            raise ConfigError(
                f"refusing to overwrite: {entry.name} is a directory", path=path, hint="Remove it by hand"
            )
    if existing:
        # Mark the directory unfinished and drop what declares it complete before deleting
        # anything else, so a crash while clearing never leaves an old manifest over missing files.
        (path / WRITING_MARKER).write_bytes(b"")
        for name in _COMPLETION_FILES:
            with contextlib.suppress(FileNotFoundError):
                (path / name).unlink()
        fsync_dir(path)
        for entry in existing:
            if entry.name != WRITING_MARKER:
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()


HeaderParser = Callable[..., tuple[np.dtype, int]]


def read_native_shard(
    root: Path, stem: str, *, dtype_hint: np.dtype | None = None, header: HeaderParser = parse_header
) -> Shard:
    """Validate one ``stem.idx`` / ``stem.bin`` pair (headers, sizes, offsets) and return its shard."""
    idx_path = root / f"{stem}.idx"
    bin_path = root / f"{stem}.bin"
    if not os.path.lexists(idx_path):
        raise MissingFileError(f"{bin_path.name} has no index {idx_path.name}", path=bin_path)
    if not os.path.lexists(bin_path):
        raise MissingFileError(f"{idx_path.name} has no data file {bin_path.name}", path=idx_path)
    idx_bytes = safe_stat(root, idx_path).st_size
    bin_size = safe_stat(root, bin_path).st_size
    with open(idx_path, "rb") as handle:
        head = handle.read(_HEADER.size)
    dtype, count = header(head, path=idx_path, file_size=idx_bytes)
    if dtype_hint is not None and dtype != dtype_hint:
        raise FormatError(
            f"shard dtype {dtype.name} differs from the dataset's {dtype_hint.name}",
            path=idx_path,
            field="dtype",
            hint="All shards of one dataset (or bucket) need one dtype: convert or re-tokenize the odd ones",
        )
    raw = idx_path.read_bytes()
    if len(raw) != idx_bytes:
        raise TruncatedError(f"index changed size while being read ({len(raw)} bytes)", path=idx_path)
    offsets = np.frombuffer(raw, dtype="<i8", count=count + 1, offset=_HEADER.size).astype(np.int64)
    overlaps = np.frombuffer(raw, dtype="<u2", count=count, offset=_HEADER.size + 8 * (count + 1))
    if bin_size % dtype.itemsize:
        raise TruncatedError(
            f"data file has {bin_size} bytes, not a multiple of the {dtype.name} item size {dtype.itemsize}",
            path=bin_path,
        )
    num_tokens = bin_size // dtype.itemsize
    validate_offsets(offsets, overlaps, num_tokens, idx_path=idx_path, bin_path=bin_path)
    return Shard(
        tokens_path=bin_path,
        dtype=dtype,
        num_tokens=num_tokens,
        offsets=offsets,
        overlap_prefix=overlaps.astype(np.uint16),
        name=stem,
    )


def validate_offsets(
    offsets: np.ndarray, overlaps: np.ndarray, num_tokens: int, *, idx_path: Path, bin_path: Path
) -> None:
    """Offsets start at 0, never decrease, end at the data's token count; overlaps fit their entries."""
    if offsets[0] != 0:
        raise IndexCorruptError(
            f"first offset is {int(offsets[0])}, expected 0",
            path=idx_path,
            offset=_HEADER.size,
            field="offsets",
        )
    steps = np.diff(offsets)
    if len(steps) and steps.min() < 0:
        i = int(np.argmax(steps < 0))
        raise IndexCorruptError(
            f"offsets decrease ({int(offsets[i])} then {int(offsets[i + 1])}), expected non-decreasing",
            path=idx_path,
            offset=_HEADER.size + 8 * (i + 1),
            record=i,
            field="offsets",
        )
    if offsets[-1] != num_tokens:
        cls = TruncatedError if offsets[-1] > num_tokens else IndexCorruptError
        raise cls(
            f"final offset {int(offsets[-1])} differs from the data file's {num_tokens} tokens",
            path=bin_path if offsets[-1] > num_tokens else idx_path,
            field="offsets",
        )
    if len(overlaps):
        bad = overlaps.astype(np.int64) > steps
        if bad.any():
            i = int(np.argmax(bad))
            raise IndexCorruptError(
                f"overlap prefix {int(overlaps[i])} is longer than its entry of {int(steps[i])} tokens",
                path=idx_path,
                record=i,
                field="overlap_prefix",
            )


def is_native(path: Path) -> bool:
    """A directory with a native manifest, or with .idx files that start with the GPTS magic."""
    if not path.is_dir():
        return False
    manifest = path / MANIFEST_NAME
    if manifest.is_file():
        try:
            return b'"format":"native"' in manifest.read_bytes().replace(b" ", b"")
        except OSError:
            return False
    for idx in sorted(path.glob("*.idx"))[:1]:
        try:
            with open(idx, "rb") as handle:
                return handle.read(4) == NATIVE_MAGIC
        except OSError:
            return False
    return (path / WRITING_MARKER).exists()


def _stems_without_manifest(root: Path) -> list[str]:
    """Shard stems of a directory without a manifest, in GPT-Simple's order (sorted ``.bin`` names)."""
    stems = [p.name[:-4] for p in root.glob("*.idx")]
    orphans = sorted(p.name for p in root.glob("*.bin") if not (root / (p.name[:-4] + ".idx")).exists())
    if orphans:
        raise MissingFileError(f"{orphans[0]} has no .idx", path=root / orphans[0])
    if not stems:
        raise MissingFileError(
            f"no {MANIFEST_NAME} and no .idx files", path=root, hint="Point at a directory of .bin/.idx shards"
        )
    return sorted(stems, key=lambda stem: stem + ".bin")


def index_fingerprint(shards: list[Shard]) -> str:
    """A content id of a manifest-less directory, from what fast validation read (names, offsets, overlaps)."""
    digest = xxhash.xxh3_128()
    for shard in shards:
        digest.update(shard.name.encode() + b"\0" + shard.dtype.name.encode() + b"\0")
        digest.update(np.ascontiguousarray(shard.offsets, "<i8").tobytes())
        digest.update(np.ascontiguousarray(shard.overlap_prefix, "<u2").tobytes())
    return digest.hexdigest()


def open_native(path: str | os.PathLike[str], *, validate: str = "fast", dtype: Any = None) -> TokenDataset:
    """Open a native dataset directory, with or without a manifest (see the module docstring)."""
    root = Path(path)
    if (root / WRITING_MARKER).exists():
        raise FormatError(
            f"{WRITING_MARKER} is present: a writer did not finish (killed or still running)",
            path=root,
            hint="Wait for the writer, or rerun the command that writes this dataset",
        )
    dtype_hint = as_token_dtype(dtype) if dtype is not None else None
    manifest: Manifest | None = None
    if (root / MANIFEST_NAME).exists():
        safe_file(root, root / MANIFEST_NAME)
        manifest = read_manifest(root)
        if manifest.format == "native" and manifest.version != NATIVE_MANIFEST_VERSION:
            raise FormatError(
                f"manifest version {manifest.version}: the shards are in tokenloom's pre-release native layout, "
                "not GPT-Simple's",
                path=root / MANIFEST_NAME,
                field="manifest_version",
                hint=LEGACY_CONVERT_HINT,
            )
        if validate != "none":
            manifest.verify(root, deep=validate == "deep")
        stems = [f.name[:-4] for f in manifest.files if f.name.endswith(".idx")]
        manifest_dtype = as_token_dtype(manifest.dtype, field="manifest dtype")
        if dtype_hint is not None and dtype_hint != manifest_dtype:
            raise ConfigError(
                f"dtype {dtype_hint.name} was asked for, the manifest records {manifest_dtype.name}",
                path=root,
                field="dtype",
            )
        dtype_hint = manifest_dtype
    else:
        stems = _stems_without_manifest(root)
    shards = []
    for stem in stems:
        shards.append(read_native_shard(root, stem, dtype_hint=dtype_hint))
        dtype_hint = shards[0].dtype  # without a manifest the first shard sets the dtype of the rest
    if manifest is not None:
        tokens = sum(s.num_tokens for s in shards)
        documents = sum(s.num_entries for s in shards)
        if (tokens, documents) != (manifest.num_tokens, manifest.num_documents):
            raise IndexCorruptError(
                f"shards hold {tokens} tokens in {documents} entries, the manifest records "
                f"{manifest.num_tokens} in {manifest.num_documents}",
                path=root / MANIFEST_NAME,
            )
    else:
        log.info(
            "%s: no manifest (GPT-Simple shards?): opened %d shards after structural validation; "
            "`tokenloom validate --write-manifest %s` records checksums",
            root,
            len(shards),
            root,
        )
    dataset = TokenDataset(
        shards,
        format="native",
        root=root,
        eos_id=manifest.eos_id if manifest else None,
        vocab_size=manifest.vocab_size if manifest else None,
        fingerprint=manifest.fingerprint if manifest else index_fingerprint(shards),
        tokenizer_fingerprint=manifest.tokenizer_fingerprint if manifest else None,
        metadata=manifest.metadata if manifest else {"manifest": False},
    )
    if validate == "deep":
        dataset.check_token_range()
        dataset.check_eos_placement()
    return dataset


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
    dataset = open_native(root, validate="fast")
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
