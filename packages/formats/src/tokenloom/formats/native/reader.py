"""Reading native datasets: the detector, shard validation and ``open_native`` (the layout: ``layout.py``)."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from tokenloom.formats._contract import Validate
from tokenloom.formats._dataset import LazyShard, Shard, TokenDataset
from tokenloom.formats.errors import FormatError, IndexCorruptError, MissingFileError, TruncatedError
from tokenloom.formats.io.atomic import WRITING_MARKER
from tokenloom.formats.io.dtypes import as_token_dtype, check_asked_dtype, token_count
from tokenloom.formats.io.index_blocks import IndexBlocks
from tokenloom.formats.io.index_map import (
    SCAN_CHUNK_ENTRIES,
    array_in,
    checked_before,
    derived_index,
    iter_chunks,
    map_file,
    release_pages,
    remember_checked,
)
from tokenloom.formats.io.manifest import MANIFEST_NAME, Manifest, manifest_names_format, read_manifest
from tokenloom.formats.io.output import refuse_unfinished
from tokenloom.formats.io.paths import as_path, first_index, pair_stats, safe_file, starts_with
from tokenloom.formats.io.scan import RisingFromZero
from tokenloom.formats.io.urls import StoredPath
from tokenloom.formats.native.layout import HEADER as _HEADER
from tokenloom.formats.native.layout import (
    LEGACY_CONVERT_HINT,
    NATIVE_MAGIC,
    entry_count,
    no_overlaps_recorded,
    parse_header,
    parse_legacy_header,
)

log = logging.getLogger("tokenloom.formats")

__all__ = [
    "NativeShard",
    "every_shard_stats",
    "is_native",
    "open_native",
    "open_native_v0",
    "read_native_shard",
    "read_native_shards",
]


#: the manifest version whose native shards are in GPT-Simple's layout (1: tokenloom's pre-release layout)
NATIVE_MANIFEST_VERSION = 2


HeaderParser = Callable[..., tuple[np.dtype, int]]
_OFFSETS_CHECKED = "native offsets and overlaps checked"
_FINGERPRINT = "native index fingerprint"


def read_native_shard(
    root: Path,
    stem: str,
    *,
    dtype_hint: np.dtype | None = None,
    header: HeaderParser = parse_header,
    recheck: bool = False,
    stats: tuple[os.stat_result, os.stat_result] | None = None,
    offsets_checked: bool = False,
) -> Shard:
    """Validate one ``stem.idx`` / ``stem.bin`` pair (headers, sizes, offsets) and return its shard.

    The offsets are scanned once per version of the pair (remembered in the index cache,
    :func:`~tokenloom.formats.io.index_map.remember_checked`); ``recheck`` scans them again.
    ``stats``: the pair's :func:`pair_stats`, when the caller took them; ``offsets_checked``: the caller
    found in the index cache that the offsets of this version of the pair passed (with every other shard).
    """
    folder = os.path.join(root, "")  # ends with a separator: + name is a child path (faster than join)
    idx_path = folder + stem + ".idx"
    bin_path = Path(folder + stem + ".bin")
    idx_info, bin_info = stats if stats is not None else pair_stats(root, stem)
    idx_bytes, bin_size = idx_info.st_size, bin_info.st_size
    # one open and one map of the .idx serve its header and both arrays (opening 1,000 shards: 1,000 opens)
    mapped = map_file(idx_path) if idx_bytes >= _HEADER.size else None
    head = mapped[: _HEADER.size] if mapped is not None else Path(idx_path).read_bytes()[: _HEADER.size]
    dtype, count = header(head, path=idx_path, file_size=idx_bytes)
    if dtype_hint is not None and dtype != dtype_hint:
        raise FormatError(
            f"shard dtype {dtype.name} differs from the dataset's {dtype_hint.name}",
            path=idx_path,
            field="dtype",
            hint="All shards of one dataset (or bucket) need one dtype: convert or re-tokenize the odd ones",
        )
    # mapped, not read: a 10^9-entry index costs no RAM until entries are used
    offsets = array_in(mapped, idx_path, "<i8", _HEADER.size, count + 1)
    overlaps = array_in(mapped, idx_path, "<u2", _HEADER.size + 8 * (count + 1), count)
    num_tokens = token_count(bin_size, dtype, path=bin_path, what="data file")
    pair = [idx_path, bin_path]
    if recheck or not (offsets_checked or checked_before(pair, _OFFSETS_CHECKED, [idx_info, bin_info])):
        validate_offsets(offsets, overlaps, num_tokens, idx_path=idx_path, bin_path=bin_path)
        remember_checked(pair, _OFFSETS_CHECKED, [idx_info, bin_info])
    elif offsets[-1] != num_tokens:  # cannot differ for the same file versions; cheap to be sure
        validate_offsets(offsets, overlaps, num_tokens, idx_path=idx_path, bin_path=bin_path)
    return Shard(bin_path, dtype, num_tokens, offsets, overlaps, name=stem)


class NativeShard(LazyShard):
    """A native shard over its ``.idx`` read by blocks (:class:`IndexBlocks`, local or remote): the entry count
    comes from the index's size, the header is checked when the index is first touched, each block of
    entries when first used (:class:`~tokenloom.formats._dataset.LazyShard`)."""

    _header_checked = False

    def check_entries(self, first: int, stop: int) -> None:
        if not self._header_checked:
            self.index.ensure(0, _HEADER.size, self._describe)
            found, count = parse_header(bytes(self.index.buffer[: _HEADER.size]), path=self.index.where,
                                        file_size=self.index.size)  # fmt: skip
            if found != self.dtype:
                raise FormatError(
                    f"shard dtype {found.name} differs from the manifest's {self.dtype.name}",
                    path=self.index.where,
                    field="dtype",
                    hint="The index or the manifest changed after the dataset was written: re-create the dataset",
                )
            self._header_checked = count == self._count  # (the count follows from the size: parse_header checks it)
        super().check_entries(first, stop)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_header_checked", None)
        return state


def _lazy_shards(
    root: Path, manifest: Manifest, stems: list[str], stats: list[tuple[os.stat_result, os.stat_result]]
) -> list[Shard]:
    """Every shard read by blocks (:class:`NativeShard`; nothing read yet): the entry count from each index's
    size; headers and final offsets checked now, the rest of each index when touched."""
    folder = os.path.join(root, "")
    stored = isinstance(root, StoredPath)  # in object storage: no index byte is fetched before a shard is touched
    zero = no_overlaps_recorded(manifest.metadata)
    dtype = as_token_dtype(manifest.dtype)
    by_name = {entry.name: entry for entry in manifest.files}
    shards: list[Shard] = []
    for stem, (idx_info, bin_info) in zip(stems, stats, strict=True):
        entry = by_name[stem + ".idx"]
        where = root / f"{stem}.idx" if stored else folder + stem + ".idx"
        index = IndexBlocks(where, idx_info.st_size, hashes=entry.blocks, checksum=entry.xxh3_128)
        bin_path = root / f"{stem}.bin" if stored else Path(folder + stem + ".bin")
        tokens = token_count(bin_info.st_size, dtype, path=bin_path, what="data file")
        count = entry_count(index.size, path=index.where)
        overlaps_at = None if zero else _HEADER.size + 8 * (count + 1)
        shard = NativeShard(
            bin_path, dtype, tokens, index, count=count, offsets_at=_HEADER.size, overlaps_at=overlaps_at, name=stem
        )
        if not stored:
            shard.check_entries(max(count - 1, 0), count)  # the last offset is the data's token count
        shards.append(shard)
    return shards


def every_shard_stats(
    root: Path, stems: list[str], listed: dict[str, os.stat_result] | None = None
) -> list[tuple[os.stat_result, os.stat_result]]:
    """:func:`pair_stats` of every stem; ``listed``: stats the manifest check took, by file name (reused)."""
    stats = []
    for stem in stems:
        pair = (listed.get(stem + ".idx"), listed.get(stem + ".bin")) if listed is not None else (None, None)
        stats.append((pair[0], pair[1]) if pair[0] is not None and pair[1] is not None else pair_stats(root, stem))
    return stats


def read_native_shards(
    root: Path,
    stems: list[str],
    stats: list[tuple[os.stat_result, os.stat_result]],
    *,
    dtype_hint: np.dtype | None,
    recheck: bool = False,
    header: HeaderParser = parse_header,
) -> list[Shard]:
    """:func:`read_native_shard` of every stem, in order (the first shard sets the dtype of the rest).

    ``stats``: :func:`every_shard_stats`. With every pair's version known first, the index cache is asked
    once whether all of them passed the offsets check, not once per shard.
    """
    folder = os.path.join(root, "")
    sources = [folder + stem + suffix for stem in stems for suffix in (".idx", ".bin")]
    versions = [info for pair in stats for info in pair]
    every_shard = f"{_OFFSETS_CHECKED} in {len(stems)} shards"
    checked = not recheck and checked_before(sources, every_shard, versions)
    shards: list[Shard] = []
    for stem, pair in zip(stems, stats, strict=True):
        shards.append(
            read_native_shard(
                root, stem, dtype_hint=dtype_hint, header=header, recheck=recheck, stats=pair, offsets_checked=checked
            )
        )
        dtype_hint = shards[0].dtype
    if not checked:
        remember_checked(sources, every_shard, versions)
    return shards


def validate_offsets(
    offsets: np.ndarray,
    overlaps: np.ndarray,
    num_tokens: int,
    *,
    idx_path: Path | str,
    bin_path: Path | str,
    chunk: int = SCAN_CHUNK_ENTRIES,
) -> None:
    """Offsets start at 0, never decrease, end at the data's token count; overlaps fit their entries.

    One pass over both arrays in bounded chunks (a memory-mapped index is never read whole).
    """
    if offsets[-1] != num_tokens:
        cls = TruncatedError if offsets[-1] > num_tokens else IndexCorruptError
        raise cls(
            f"final offset {int(offsets[-1])} differs from the data file's {num_tokens} tokens",
            path=bin_path if offsets[-1] > num_tokens else idx_path,
            field="offsets",
        )
    rising = RisingFromZero(what="offsets", one="offset", path=idx_path, at=_HEADER.size, field="offsets")
    previous: int | None = None
    for start, part in iter_chunks(offsets, chunk):
        steps = rising.check(part, start)  # the lengths of the entries whose two ends are known so far:
        first = start - 1 if previous is not None else 0  # from ``first`` to ``start + len(part) - 2``
        count = len(steps)
        if count and len(overlaps):
            prefix = np.asarray(overlaps[first : first + count], dtype=np.int64)
            release_pages(overlaps, first, first + count)
            bad = prefix > steps
            if bad.any():
                i = int(np.argmax(bad))
                raise IndexCorruptError(
                    f"overlap prefix {int(prefix[i])} is longer than its entry of {int(steps[i])} tokens",
                    path=idx_path,
                    record=first + i,
                    field="overlap_prefix",
                )
        previous = int(part[-1])


def is_native(path: Path) -> bool:
    """A directory with a native manifest, or with .idx files that start with the GPTS magic."""
    if not path.is_dir():
        return False
    says_native = manifest_names_format(path, "native")
    if says_native is not None:
        return says_native
    index = first_index(path)
    return starts_with(index, NATIVE_MAGIC) if index is not None else (path / WRITING_MARKER).exists()


def _stems_without_manifest(root: Path) -> list[str]:
    """Shard stems of a directory without a manifest, in GPT-Simple's order (sorted ``.bin`` names)."""
    names: set[str] = set()  # one listing, no Path per file (1,000 shards: 2,000 names)
    links: set[str] = set()
    with contextlib.suppress(PermissionError), os.scandir(root) as listing:  # as glob: unlistable is empty
        for entry in listing:
            names.add(entry.name)
            if entry.is_symlink():
                links.add(entry.name)

    def exists(name: str) -> bool:  # Path.exists: a dangling link is no file
        return name in names and (name not in links or os.path.exists(os.path.join(root, name)))

    stems = [name[:-4] for name in names if name.endswith(".idx")]
    orphans = sorted(name for name in names if name.endswith(".bin") and not exists(name[:-4] + ".idx"))
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
        for array, dtype in ((shard.offsets, "<i8"), (shard.overlap_prefix, "<u2")):
            for _, part in iter_chunks(array):  # streamed: the index may be a 10^9-entry memory map
                digest.update(part.astype(dtype, copy=False).tobytes())
    return digest.hexdigest()


def _cached_fingerprint(root: Path, shards: list[Shard], idx_infos: list[os.stat_result]) -> str:
    """:func:`index_fingerprint`, computed once per version of the index files (kept in the index cache).

    ``idx_infos``: the index files' stats, taken before they were read.
    """
    folder = os.path.join(root, "")
    sources = [f"{folder}{shard.name}.idx" for shard in shards]
    dtype_name = shards[0].dtype.name  # every shard's: read_native_shards refuses another (dtype.name is slow)
    what = f"{_FINGERPRINT} of {[(s.name, dtype_name) for s in shards]}"

    def build() -> list[np.ndarray]:
        digest = index_fingerprint(shards)
        return [np.array([int(digest[:16], 16), int(digest[16:], 16)], dtype=np.uint64).view(np.int64)]

    halves = derived_index(sources, what, 2, build, infos=idx_infos)
    return "".join(f"{int(v):016x}" for v in np.asarray(halves).view(np.uint64))


def open_native(path: str | os.PathLike[str], *, validate: Validate = Validate.FAST, dtype: Any = None) -> TokenDataset:
    """Open a native dataset directory, with or without a manifest.

    ``validate="fast"`` (the default) with a manifest that records index block hashes (every native writer
    since the open by blocks; ``tokenloom validate --write-manifest`` adds them) reads no index at open: it checks the
    manifest, every file's size, each shard's header and last index block (the final offset is the data's
    token count), and then each block of 2^16 entries the first time a read touches it (its 1 MiB index
    blocks against their hashes, offsets rising within the shard, overlap prefixes fitting their entries):
    a damaged block is a ChecksumError or IndexCorruptError naming the file, the byte offset and the
    entries when touched, never wrong data. Reading a whole ``shard.offsets`` (``doc_lengths``) checks it
    all. Without such hashes (an older manifest, or none: GPT-Simple's shards) fast validation scans every
    offset and checksums every index file at the first open of those file versions, as before.
    ``validate="deep"`` adds, at open, the checksum of every file (data and index), the scan of every
    offset and overlap prefix, token ids against the vocab size and the EOS placement.
    """
    return _open_native(as_path(path), validate, dtype)


def open_native_v0(
    path: str | os.PathLike[str], *, validate: Validate = Validate.FAST, dtype: Any = None
) -> TokenDataset:
    """Open a native directory in tokenloom's pre-release layout (``native-v0``: manifest version 1, ``<4sHHQ``
    index headers, the same arrays after them), so that it converts in one command
    (``tokenloom convert OLD NEW --to native --from native-v0``). Never chosen by detection: ``open_dataset`` on
    such a directory raises a FormatError that names that command."""
    return _open_native(as_path(path), validate, dtype, legacy=True)


def _open_native(root: Path, validate: Validate, dtype: Any, *, legacy: bool = False) -> TokenDataset:
    refuse_unfinished(root)
    dtype_hint = as_token_dtype(dtype) if dtype is not None else None
    manifest: Manifest | None = None
    listed: dict[str, os.stat_result] | None = None  # the manifest check's stats, by file name
    if (root / MANIFEST_NAME).exists():
        safe_file(root, root / MANIFEST_NAME)
        manifest = read_manifest(root)
        if legacy and (manifest.format != "native" or manifest.version != 1):
            raise FormatError(
                f"manifest says format {manifest.format!r} version {manifest.version}, expected native version 1",
                path=root / MANIFEST_NAME,
                hint="Only pre-release tokenloom native data needs --from native-v0; open this one as it is",
            )
        if not legacy and manifest.format == "native" and manifest.version != NATIVE_MANIFEST_VERSION:
            raise FormatError(
                f"manifest version {manifest.version}: the shards are in tokenloom's pre-release native layout, "
                "not GPT-Simple's",
                path=root / MANIFEST_NAME,
                field="manifest_version",
                hint=LEGACY_CONVERT_HINT,
            )
        stems = [f.name[:-4] for f in manifest.files if f.name.endswith(".idx")]
        by_blocks = not legacy and (
            isinstance(root, StoredPath)  # an index in object storage is always read by blocks (checksum: whole)
            or (validate != Validate.DEEP and all(manifest.file(f"{stem}.idx").blocks is not None for stem in stems))
        )
        if validate != Validate.NONE:
            listed = manifest.verify(root, deep=validate == Validate.DEEP, index_blocks=by_blocks)
        dtype_hint = as_token_dtype(manifest.dtype, field="manifest dtype")
        check_asked_dtype(dtype, dtype_hint, recorded="the manifest records", path=root)
        if by_blocks:  # the index is read and checked where it is used (its block hashes), not at open
            shards = _lazy_shards(root, manifest, stems, every_shard_stats(root, stems, listed))
            return shards_dataset(shards, "native", root, manifest, validate)
    else:
        stems = _stems_without_manifest(root)
    stats = every_shard_stats(root, stems, listed)
    header = parse_legacy_header if legacy else parse_header
    shards = read_native_shards(
        root, stems, stats, dtype_hint=dtype_hint, recheck=validate == Validate.DEEP, header=header
    )
    if legacy or manifest is not None:
        return shards_dataset(shards, "native-v0" if legacy else "native", root, manifest, validate)
    log.info(
        "%s: no manifest (GPT-Simple shards?): opened %d shards after structural validation; "
        "`tokenloom validate --write-manifest %s` records checksums",
        root,
        len(shards),
        root,
    )
    fingerprint = _cached_fingerprint(root, shards, [idx for idx, _ in stats])
    without: dict[str, Any] = {"fingerprint": fingerprint, "metadata": {"manifest": False}}
    return shards_dataset(shards, "native", root, manifest, validate, without=without)


def shards_dataset(
    shards: list[Shard],
    format: str,
    root: Path,
    manifest: Manifest | None,
    validate: Validate,
    *,
    without: dict[str, Any] | None = None,
) -> TokenDataset:
    """The dataset over native ``shards``, described by ``manifest`` (its totals checked) or by ``without``."""
    described = without or {}
    if manifest is not None:
        tokens = sum(s.num_tokens for s in shards)
        documents = sum(s.num_entries for s in shards)
        if (tokens, documents) != (manifest.num_tokens, manifest.num_documents):
            raise IndexCorruptError(
                f"shards hold {tokens} tokens in {documents} entries, the manifest records "
                f"{manifest.num_tokens} in {manifest.num_documents}",
                path=root / MANIFEST_NAME,
            )
        recorded = ("eos_id", "vocab_size", "fingerprint", "tokenizer_fingerprint", "metadata")
        described = {name: getattr(manifest, name) for name in recorded}
    return TokenDataset(shards, format=format, root=root, **described).check_deep(validate)
