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

The dtype of ``.npy`` shards is read from each header (see ``npy.py``). Raw
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
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from tokenloom.formats._contract import Validate
from tokenloom.formats._dataset import Shard, TokenDataset
from tokenloom.formats.errors import (
    ConfigError,
    FormatError,
    IndexCorruptError,
    MissingFileError,
    TokenRangeError,
)
from tokenloom.formats.flat.npy import read_npy_header
from tokenloom.formats.flat.tatm import METADATA_NAMES, TatmInfo, find_tatm_metadata, read_tatm_metadata
from tokenloom.formats.io.atomic import TMP_SUFFIX, WRITING_MARKER
from tokenloom.formats.io.dtypes import as_token_dtype, token_count
from tokenloom.formats.io.index_map import derived_index, iter_chunks, map_array, zeros_index
from tokenloom.formats.io.manifest import MANIFEST_NAME, Manifest, manifest_names_format, read_manifest
from tokenloom.formats.io.output import refuse_unfinished
from tokenloom.formats.io.paths import as_path, safe_file
from tokenloom.formats.io.scan import first_negative, iter_eos_offsets

__all__ = ["DOCUMENT_LENGTHS_NAME", "FLAT_SPLITS", "is_flat", "open_flat"]

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
    says_flat = manifest_names_format(path, "flat")
    if says_flat is not None:
        return says_flat
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
    validate: Validate = Validate.FAST,
    dtype: Any = None,
    file_pattern: str | None = None,
    split: str | None = None,
    eos_id: int | None = None,
    vocab_size: int | None = None,
) -> TokenDataset:
    """Open flat shards: a directory (see the module docstring) or a single ``.npy``/``.bin`` file."""
    target = as_path(path)
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
        refuse_unfinished(root)
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
            if validate != Validate.NONE:
                manifest.verify(root, deep=validate == Validate.DEEP)
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
    rederive = validate == Validate.DEEP
    if split == "lengths" and manifest is not None:
        _apply_document_lengths(root, manifest, recorded, shards, rederive=rederive)
    for shard in shards:
        if split == "eos":
            shard.offsets = _eos_offsets(shard, int(eos_id), rederive=rederive)  # type: ignore[arg-type]
            shard.overlap_prefix = zeros_index(shard.num_entries)
        if validate != Validate.NONE:
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
    if validate == Validate.DEEP:
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
            hint = "The file was cut short, or the dtype is wrong; pass the right dtype="
            count = token_count(size, dtype, path=shard.tokens_path, what="shard", hint=hint)
            shards[i] = _shard(shard.tokens_path, dtype, count, 0)
    return shards


def _apply_document_lengths(
    root: Path, manifest: Manifest, recorded: dict[str, Any], shards: list[Shard], *, rederive: bool
) -> None:
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
    lengths = map_array(path, "<i8", 0, manifest.num_documents)
    first = 0
    for shard, count in zip(shards, counts, strict=True):
        what = f"flat document offsets {first}+{count}"
        build = partial(_cumulated_lengths, lengths, first, count, path=path)
        offsets = derived_index([path], what, count + 1, build, rebuild=rederive)
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
        shard.overlap_prefix = zeros_index(count)
        first += count


def _cumulated_lengths(lengths: np.ndarray, first: int, count: int, *, path: Path) -> Iterator[np.ndarray]:
    """Offsets 0, l0, l0 + l1, ... of documents ``first`` to ``first + count``, in chunks (negative lengths refused)."""
    yield np.zeros(1, dtype=np.int64)
    total = 0
    for start, part in iter_chunks(lengths[first : first + count]):
        if part.min() < 0:
            record = first + start + int(np.argmax(part < 0))
            raise IndexCorruptError(
                f"document length {int(lengths[record])} is negative",
                path=path,
                offset=8 * record,
                record=record,
                field="document_lengths",
            )
        ends = np.cumsum(part, dtype=np.int64)
        ends += total
        total = int(ends[-1])
        yield ends


def _eos_offsets(shard: Shard, eos_id: int, *, rederive: bool) -> np.ndarray:
    """Entry offsets ending just after each ``eos_id`` in the shard's tokens: one streamed scan, then cached."""
    what = f"flat eos offsets {eos_id} {shard.dtype.str} {shard.tokens_offset} {shard.num_tokens}"
    return derived_index(
        [shard.tokens_path], what, None, lambda: iter_eos_offsets(shard.tokens, eos_id), rebuild=rederive
    )


def _shard(path: Path, dtype: np.dtype, count: int, data_offset: int) -> Shard:
    return Shard.single_entry(path, dtype, count, tokens_offset=data_offset, name=path.name)


def _refuse_negative(shard: Shard) -> None:
    position = first_negative(shard.tokens)
    if position is not None:
        raise TokenRangeError(
            f"token id {int(shard.tokens[position])} is negative",
            path=shard.tokens_path,
            offset=shard.tokens_offset + position * shard.dtype.itemsize,
            hint="Token ids must be >= 0; the shard is corrupt or not token data",
        )
