"""The flat format: a directory of 1-D token shards (``.npy`` or raw ``.bin``), as
KempnerForge and tatm train on them.

A flat shard is a token stream with no index, so the format has no document
boundaries of its own. How ``open_flat`` turns shards into entries (``split``):

- ``"shard"`` (the default for foreign data): each shard is ONE entry, its whole
  token stream. Nothing is guessed, opening costs no token scan, and windowed
  training (which is what KempnerForge does with these shards) sees the stream
  exactly as stored.
- ``"eos"``: entries end just after each ``eos_id`` (a trailing run without EOS
  is a last entry). This needs one scan of every token at open time.
- ``"lengths"``: tokenloom's own flat writer records every document's length in
  ``document_lengths.i64`` (raw little-endian int64, one per document, listed in
  the manifest as an index file) and each shard's document count in the
  manifest, so any documents (empty ones included) round-trip exactly. The
  reader uses them by default when the manifest says so. The file's name matches
  neither ``*.npy`` nor ``*.bin``, so foreign readers that glob shards skip it.

The dtype of ``.npy`` shards is read from each header (see ``_npy``). Raw
``.bin`` shards have none: it comes from ``dtype=``, the manifest, or tatm's
metadata, in that order, and they must agree. ``dtype="infer"`` guesses from the
sizes (all multiples of 4 bytes: uint32, else uint16) and logs the guess; an
undeclared dtype is otherwise a FormatError.

Files are ``file_pattern`` matches inside the directory, sorted by name. With a
manifest, only files the manifest lists are read.
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from tokenloom.formats._atomic import TMP_SUFFIX, atomic_write_bytes, fsync_dir, temp_path
from tokenloom.formats._dataset import Shard, TokenDataset
from tokenloom.formats._dtypes import as_token_dtype
from tokenloom.formats._manifest import MANIFEST_NAME, Manifest, describe_files, read_manifest, write_manifest
from tokenloom.formats._native import WRITING_MARKER, prepare_output_dir, shard_cut
from tokenloom.formats._npy import npy_header, read_npy_header
from tokenloom.formats._paths import safe_file
from tokenloom.formats._scan import eos_offsets, first_negative
from tokenloom.formats._tatm import METADATA_NAMES, TatmInfo, find_tatm_metadata, read_tatm_metadata
from tokenloom.formats._writer import TokenWriter
from tokenloom.formats.errors import (
    ConfigError,
    FormatError,
    IndexCorruptError,
    MissingFileError,
    TokenRangeError,
    TruncatedError,
)

__all__ = ["DOCUMENT_LENGTHS_NAME", "FLAT_SPLITS", "FlatWriter", "is_flat", "open_flat"]

log = logging.getLogger("tokenloom.formats")

FLAT_SPLITS = ("shard", "eos", "lengths")
DOCUMENT_LENGTHS_NAME = "document_lengths.i64"
_RESERVED = {MANIFEST_NAME, WRITING_MARKER, DOCUMENT_LENGTHS_NAME, *METADATA_NAMES}


@dataclass(frozen=True, slots=True)
class _Declared:
    dtype: np.dtype | None
    source: str


def is_flat(path: Path) -> bool:
    """A flat manifest, tatm metadata with ``tokenized_info``, or ``.npy`` shards (and no .idx)."""
    if path.is_file():
        return path.suffix == ".npy"
    if not path.is_dir():
        return False
    manifest = path / MANIFEST_NAME
    if manifest.is_file():
        try:
            return b'"format":"flat"' in manifest.read_bytes().replace(b" ", b"")
        except OSError:
            return False
    metadata = find_tatm_metadata(path)
    if metadata is not None:
        with contextlib.suppress(OSError):
            if b"tokenized_info" in metadata.read_bytes()[: 1 << 20]:
                return True
    has_idx = next(path.glob("*.idx"), None) is not None
    return not has_idx and next(path.glob("*.npy"), None) is not None


def _check_pattern(pattern: str) -> str:
    if not pattern or "/" in pattern or "\\" in pattern or ".." in pattern:
        raise ConfigError(
            f"file_pattern {pattern!r} must match names inside the dataset directory (no '/' or '..')",
            field="file_pattern",
        )
    return pattern


def _declared_dtype(
    root: Path, explicit: Any, manifest: Manifest | None, tatm: TatmInfo | None
) -> tuple[_Declared, bool]:
    """The declared dtype (None if nothing declares one) and whether ``infer`` was asked for."""
    infer = isinstance(explicit, str) and explicit == "infer"
    candidates: list[tuple[np.dtype, str]] = []
    if explicit is not None and not infer:
        candidates.append((as_token_dtype(explicit), "dtype="))
    if manifest is not None:
        candidates.append((as_token_dtype(manifest.dtype, field="manifest dtype"), MANIFEST_NAME))
    if tatm is not None and tatm.dtype is not None:
        try:
            candidates.append((as_token_dtype(tatm.dtype), tatm.source.name))
        except ConfigError as exc:
            raise FormatError(exc.problem, path=tatm.source, field="dtype") from None
    for dtype, source in candidates[1:]:
        if dtype != candidates[0][0]:
            raise ConfigError(
                f"{candidates[0][1]} says {candidates[0][0].name}, {source} says {dtype.name}",
                path=root,
                field="dtype",
                hint="Pass the dtype the data was written with, or fix the metadata",
            )
    if candidates:
        return _Declared(candidates[0][0], candidates[0][1]), infer
    return _Declared(None, ""), infer


def _candidate_files(root: Path, pattern: str, manifest: Manifest | None) -> list[Path]:
    if manifest is not None:
        names = sorted(
            f.name for f in manifest.files if fnmatch.fnmatchcase(f.name, pattern) and f.name not in _RESERVED
        )
        return [root / name for name in names]
    found = []
    for path in root.glob(pattern):
        if path.name in _RESERVED or path.name.endswith(TMP_SUFFIX):
            continue
        found.append(path)
    return sorted(found, key=lambda p: p.name)


def open_flat(
    path: str | os.PathLike[str],
    *,
    validate: str = "fast",
    dtype: Any = None,
    file_pattern: str | None = None,
    split: str | None = None,
    eos_id: int | None = None,
    vocab_size: int | None = None,
) -> TokenDataset:
    """Open flat shards: a directory (see the module docstring) or a single ``.npy``/``.bin`` file."""
    target = Path(path)
    manifest: Manifest | None = None
    tatm: TatmInfo | None = None
    recorded: dict[str, Any] = {}  # what tokenloom's flat writer recorded in the manifest
    if target.is_file():
        root, files = target.parent, [target]
        pattern = target.name
    else:
        root = target
        if not root.is_dir():
            raise FormatError("flat shards are a directory or a single .npy/.bin file", path=root)
        if (root / WRITING_MARKER).exists():
            raise FormatError(
                f"{WRITING_MARKER} is present: a writer did not finish (killed or still running)",
                path=root,
                hint="Wait for the writer, or rerun the command that writes this dataset",
            )
        if (root / MANIFEST_NAME).exists():
            safe_file(root, root / MANIFEST_NAME)
            manifest = read_manifest(root)
            if manifest.format != "flat":
                raise FormatError(
                    f"the manifest describes a {manifest.format!r} dataset, not flat shards",
                    path=root / MANIFEST_NAME,
                    field="format",
                    hint=f"Open it with format={manifest.format!r}",
                )
            if validate != "none":
                manifest.verify(root, deep=validate == "deep")
        metadata_path = find_tatm_metadata(root)
        if metadata_path is not None:
            safe_file(root, metadata_path)
            tatm = read_tatm_metadata(metadata_path)
        flat_metadata = manifest.metadata.get("flat", {}) if manifest is not None else {}
        recorded = flat_metadata if isinstance(flat_metadata, dict) else {}
        pattern = file_pattern or recorded.get("file_pattern") or (tatm.file_pattern if tatm else None)
        if pattern is None:
            pattern = "*.npy" if next(root.glob("*.npy"), None) is not None else "*.bin"
        pattern = _check_pattern(str(pattern))
        files = _candidate_files(root, pattern, manifest)
        if not files:
            raise FormatError(
                f"no shard files match {pattern!r}",
                path=root,
                field="file_pattern",
                hint="Pass file_pattern=... (e.g. '*.npy' or 'tokenized_*.bin')",
            )
        lengths_recorded = recorded.get("document_boundaries") == "lengths"
        if split is None and lengths_recorded and pattern == recorded.get("file_pattern"):
            split = "lengths"
    declared, infer = _declared_dtype(root, dtype, manifest, tatm)
    if split is None:
        split = "shard"
    if split not in FLAT_SPLITS:
        raise ConfigError(f"split={split!r}, expected one of {list(FLAT_SPLITS)}", field="split")
    if eos_id is None and manifest is not None:
        eos_id = manifest.eos_id
    if split == "lengths" and (manifest is None or recorded.get("document_boundaries") != "lengths"):
        raise ConfigError(
            "split='lengths' needs the document lengths tokenloom's flat writer records, and none are recorded",
            path=root,
            field="split",
        )
    if split == "eos" and eos_id is None:
        raise ConfigError("split='eos' needs the EOS id, and none was given or recorded", path=root, field="eos_id")
    if vocab_size is None:
        vocab_size = manifest.vocab_size if manifest is not None else (tatm.vocab_size if tatm else None)

    shards = _read_shards(root, files, declared, infer=infer)
    if split == "lengths" and manifest is not None:
        _apply_document_lengths(root, manifest, recorded, shards)
    for shard in shards:
        if split == "eos":
            shard.offsets = eos_offsets(shard.tokens, int(eos_id))  # type: ignore[arg-type]
            shard.overlap_prefix = np.zeros(shard.num_entries, dtype=np.uint16)
        if validate != "none":
            _refuse_negative(shard)
    if manifest is not None and file_pattern is None:
        tokens = sum(s.num_tokens for s in shards)
        if tokens != manifest.num_tokens:
            raise IndexCorruptError(
                f"shards hold {tokens} tokens, the manifest records {manifest.num_tokens}", path=root / MANIFEST_NAME
            )
    dataset = TokenDataset(
        shards,
        format="flat",
        root=root,
        eos_id=eos_id,
        vocab_size=vocab_size,
        fingerprint=manifest.fingerprint if manifest else None,
        tokenizer_fingerprint=manifest.tokenizer_fingerprint if manifest else None,
        metadata={
            **(manifest.metadata if manifest else {}),
            "file_pattern": pattern,
            "split": split,
            "dtype_source": declared.source or ("header" if files[0].suffix == ".npy" else "inferred"),
            **({"tokenizer": tatm.tokenizer} if tatm and tatm.tokenizer else {}),
        },
    )
    if validate == "deep":
        dataset.check_token_range()
        if split == "eos":
            dataset.check_eos_placement()
    return dataset


def _read_shards(root: Path, files: list[Path], declared: _Declared, *, infer: bool) -> list[Shard]:
    raw_sizes: dict[Path, int] = {}
    shards: list[Shard] = []
    for path in files:
        safe_file(root, path)
        size = path.stat().st_size
        if path.suffix == ".npy":
            header = read_npy_header(path, file_size=size)
            if declared.dtype is not None and header.dtype != declared.dtype:
                raise FormatError(
                    f"the .npy header says {header.dtype.name}, {declared.source} says {declared.dtype.name}",
                    path=path,
                    field="descr",
                )
            if header.count == 0:
                raise FormatError("shard holds no tokens", path=path, field="shape", hint="Remove the empty shard")
            shards.append(_shard(path, header.dtype, header.count, header.data_offset))
        else:
            if size == 0:
                raise FormatError("shard is empty (0 bytes)", path=path, hint="Remove the empty shard or re-create it")
            raw_sizes[path] = size
            shards.append(_shard(path, np.dtype("u1"), 0, 0))  # placeholder until the dtype is known
    if raw_sizes:
        dtype = declared.dtype
        if dtype is None and infer:
            dtype = as_token_dtype("uint32" if all(s % 4 == 0 for s in raw_sizes.values()) else "uint16")
            log.warning(
                "dtype='infer': guessed %s for %d raw shard(s) in %s from their sizes; pass dtype= to be sure",
                dtype.name,
                len(raw_sizes),
                root,
            )
        if dtype is None:
            raise FormatError(
                f"raw shard has no declared dtype (no {MANIFEST_NAME}, no tatm metadata, no dtype=)",
                path=next(iter(raw_sizes)),
                field="dtype",
                hint="Pass dtype='uint16' (--dtype), or dtype='infer' to guess from file sizes",
            )
        for i, shard in enumerate(shards):
            size = raw_sizes.get(shard.tokens_path)
            if size is None:
                continue
            if size % dtype.itemsize:
                raise TruncatedError(
                    f"shard has {size} bytes, not a multiple of the {dtype.name} item size {dtype.itemsize}",
                    path=shard.tokens_path,
                    hint="The file was cut short, or the dtype is wrong; pass the right dtype=",
                )
            shards[i] = _shard(shard.tokens_path, dtype, size // dtype.itemsize, 0)
    return shards


def _apply_document_lengths(root: Path, manifest: Manifest, recorded: dict[str, Any], shards: list[Shard]) -> None:
    """Set each shard's entry offsets from the recorded document lengths, checking they add up."""
    path = root / DOCUMENT_LENGTHS_NAME
    manifest_path = root / MANIFEST_NAME
    manifest.file(DOCUMENT_LENGTHS_NAME)  # MissingFileError unless the manifest lists it
    if not path.exists() and not path.is_symlink():
        raise MissingFileError(f"{DOCUMENT_LENGTHS_NAME} is listed in the manifest but absent", path=path)
    safe_file(root, path)
    size = path.stat().st_size
    if size != 8 * manifest.num_documents:
        raise IndexCorruptError(
            f"{DOCUMENT_LENGTHS_NAME} has {size} bytes, expected 8 per document for {manifest.num_documents} documents",
            path=path,
            field="document_lengths",
        )
    counts = recorded.get("shard_entries")
    if (
        not isinstance(counts, list)
        or len(counts) != len(shards)
        or not all(type(n) is int and n >= 0 for n in counts)
        or sum(counts) != manifest.num_documents
    ):
        raise IndexCorruptError(
            f"shard_entries is {str(counts)[:60]}, expected {len(shards)} counts >= 0 summing to "
            f"{manifest.num_documents}",
            path=manifest_path,
            field="metadata.flat.shard_entries",
        )
    lengths = np.fromfile(path, dtype="<i8").astype(np.int64)
    if len(lengths) and lengths.min() < 0:
        record = int(np.argmax(lengths < 0))
        raise IndexCorruptError(
            f"document length {int(lengths[record])} is negative",
            path=path,
            offset=8 * record,
            record=record,
            field="document_lengths",
        )
    first = 0
    for shard, count in zip(shards, counts, strict=True):
        offsets = np.zeros(count + 1, dtype=np.int64)
        np.cumsum(lengths[first : first + count], out=offsets[1:])
        if offsets[-1] != shard.num_tokens:
            raise IndexCorruptError(
                f"documents {first} to {first + count} add up to {int(offsets[-1])} tokens, "
                f"shard {shard.name} holds {shard.num_tokens}",
                path=path,
                offset=8 * first,
                record=first,
                field="document_lengths",
            )
        shard.offsets = offsets
        shard.overlap_prefix = np.zeros(count, dtype=np.uint16)
        first += count


def _shard(path: Path, dtype: np.dtype, count: int, data_offset: int) -> Shard:
    return Shard(
        tokens_path=path,
        dtype=dtype,
        num_tokens=count,
        offsets=np.array([0, count], dtype=np.int64),
        overlap_prefix=np.zeros(1, dtype=np.uint16),
        tokens_offset=data_offset,
        name=path.name,
    )


def _refuse_negative(shard: Shard) -> None:
    position = first_negative(shard.tokens)
    if position is not None:
        raise TokenRangeError(
            f"token id {int(shard.tokens[position])} is negative",
            path=shard.tokens_path,
            offset=shard.tokens_offset + position * shard.dtype.itemsize,
            hint="Token ids must be >= 0; the shard is corrupt or not token data",
        )


class _ShardFile:
    """One shard streamed to ``name.tmp`` and published under ``name`` by ``finish``."""

    def __init__(self, path: Path, dtype: np.dtype, *, npy: bool) -> None:
        self.path = path
        self.tmp = temp_path(path)
        self.dtype = dtype
        self.npy = npy
        self.num_tokens = 0
        self.num_entries = 0
        self.handle: BinaryIO = open(self.tmp, "wb")  # noqa: SIM115 - closed in finish/abort
        if npy:
            self.handle.write(npy_header(dtype, 0))

    def write(self, tokens: np.ndarray) -> None:
        self.handle.write(np.ascontiguousarray(tokens, dtype=self.dtype).data)
        self.num_tokens += len(tokens)

    def finish(self) -> None:
        if self.npy:
            self.handle.seek(0)
            self.handle.write(npy_header(self.dtype, self.num_tokens))
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.handle.close()
        with contextlib.suppress(FileNotFoundError):
            self.tmp.unlink()


class FlatWriter(TokenWriter):
    """Flat shards ``{file_prefix}_NNNNN.npy`` (or ``.bin``) of about ``shard_size_tokens`` tokens, manifest last.

    Documents are concatenated and never split across shards. Flat shards cannot
    hold overlap prefixes: a non-zero one is a ConfigError. See the module
    docstring for how document boundaries survive.

    Args:
        path: the dataset directory (created; must be empty unless ``overwrite``).
        shard_size_tokens: start a new shard once a shard holds at least this many tokens. None: one shard.
        file_format: ``"npy"`` (self-describing) or ``"bin"`` (raw; the dtype lives in the manifest).
        file_prefix: shard names start with this.
    """

    format = "flat"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        dtype: Any,
        vocab_size: int | None = None,
        eos_id: int | None = None,
        shard_size_tokens: int | None = None,
        file_format: str = "npy",
        file_prefix: str = "shard",
        tokenizer_fingerprint: str | None = None,
        metadata: dict[str, Any] | None = None,
        overwrite: bool = False,
    ) -> None:
        super().__init__(path, dtype=dtype, vocab_size=vocab_size, eos_id=eos_id)
        if shard_size_tokens is not None and shard_size_tokens < 1:
            raise ConfigError(f"shard_size_tokens is {shard_size_tokens}, expected >= 1", field="shard_size_tokens")
        if file_format not in ("npy", "bin"):
            raise ConfigError(f"file_format={file_format!r}, expected 'npy' or 'bin'", field="file_format")
        if not file_prefix or any(ch in file_prefix for ch in "/\\*?[") or file_prefix.startswith("."):
            raise ConfigError(f"file_prefix {file_prefix!r} must be a plain file-name prefix", field="file_prefix")
        self.shard_size_tokens = shard_size_tokens
        self.file_format = file_format
        self.file_prefix = file_prefix
        self.tokenizer_fingerprint = tokenizer_fingerprint
        self.metadata = dict(metadata or {})
        prepare_output_dir(self.path, overwrite=overwrite)
        (self.path / WRITING_MARKER).write_bytes(b"")
        fsync_dir(self.path)
        self._names: list[str] = []
        self._current: _ShardFile | None = None
        self._lengths: list[np.ndarray] = []
        self._shard_entries: list[int] = []
        self._pending_entries = 0

    @property
    def file_pattern(self) -> str:
        return f"{self.file_prefix}_*.{self.file_format}"

    def _write_batch(self, tokens: np.ndarray, lengths: np.ndarray, overlaps: np.ndarray) -> None:
        if overlaps.any():
            i = int(np.argmax(overlaps > 0))
            raise ConfigError(
                f"overlap_prefix {int(overlaps[i])}: flat shards cannot store overlap prefixes",
                path=self.path,
                record=self.num_documents + i,
                field="overlap_prefix",
                hint="Write the native format, or drop the overlap prefixes (convert --drop-overlap-prefix)",
            )
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

    def _shard(self) -> _ShardFile:
        if self._current is None:
            name = f"{self.file_prefix}_{len(self._names):05d}.{self.file_format}"
            self._current = _ShardFile(self.path / name, self.dtype, npy=self.file_format == "npy")
            self._current.num_entries, self._pending_entries = self._pending_entries, 0
            self._names.append(name)
        return self._current

    def _finish_shard(self) -> None:
        if self._current is not None:
            self._current.finish()
            self._shard_entries.append(self._current.num_entries)
            self._current = None

    def _commit(self) -> None:
        if self.num_tokens == 0:
            self._abort()
            raise ConfigError(
                "no tokens were written: flat shards cannot hold an empty dataset",
                path=self.path,
                hint="Write at least one non-empty document, or use the native format",
            )
        self._finish_shard()
        self._shard_entries[-1] += self._pending_entries  # trailing empty documents join the last shard
        self._pending_entries = 0
        lengths = np.concatenate(self._lengths) if self._lengths else np.empty(0, "<i8")
        atomic_write_bytes(self.path / DOCUMENT_LENGTHS_NAME, lengths.astype("<i8").tobytes())
        fsync_dir(self.path)
        files = [(name, "data") for name in self._names] + [(DOCUMENT_LENGTHS_NAME, "index")]
        manifest = Manifest(
            format="flat",
            dtype=self.dtype.name,
            num_tokens=self.num_tokens,
            num_documents=self.num_documents,
            files=describe_files(self.path, files),
            vocab_size=self.vocab_size,
            eos_id=self.eos_id,
            tokenizer_fingerprint=self.tokenizer_fingerprint,
            metadata={
                **self.metadata,
                "flat": {
                    "file_pattern": self.file_pattern,
                    "document_boundaries": "lengths",
                    "shard_entries": list(self._shard_entries),
                },
            },
        )
        write_manifest(self.path, manifest)
        (self.path / WRITING_MARKER).unlink()
        fsync_dir(self.path)

    def _abort(self) -> None:
        if self._current is not None:
            self._current.abort()
            self._current = None
        for name in [*self._names, DOCUMENT_LENGTHS_NAME]:
            with contextlib.suppress(FileNotFoundError):
                (self.path / name).unlink()
        with contextlib.suppress(FileNotFoundError):
            (self.path / WRITING_MARKER).unlink()
