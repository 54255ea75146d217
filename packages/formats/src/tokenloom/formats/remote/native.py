"""Opening a native dataset (``manifest.json`` + ``.idx``/``.bin`` shards) from object storage, lazily.

At open only the manifest is fetched (plus one LIST per 1,000 objects where the store can list:
every object's size and ETag, checked against the manifest and bound into the fingerprint). Each
shard's entry count comes from its ``.idx`` size as the manifest records it (a GPT-Simple ``.idx`` of
``n`` entries has exactly ``idx_size(n)`` bytes), so a 10,000-shard dataset opens without reading
10,000 indexes: a shard's ``.idx`` is fetched whole, checked against the manifest's checksum and
validated as on disk when the shard is first touched; its ``.bin`` is read by blocks.
``validate="deep"`` touches every shard and checksums every object block by block (with progress).

Every ``.bin`` block is checked against the manifest's block hashes when fetched and when a process first
maps it, and every ``.idx`` against its checksum (:mod:`.verify`); what cannot be checked (a manifest
written before block hashes, a cache block size that is not a multiple of the hash block) is said once.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from tokenloom.formats._contract import Validate
from tokenloom.formats._dataset import Shard, TokenDataset
from tokenloom.formats.errors import ChecksumError, ConfigError, FormatError, IndexCorruptError, MissingFileError
from tokenloom.formats.io.dtypes import as_token_dtype
from tokenloom.formats.io.manifest import MANIFEST_NAME, FileEntry, Manifest, read_manifest
from tokenloom.formats.io.progress import Stage
from tokenloom.formats.native.layout import HEADER, idx_size, no_overlaps_recorded, parse_header
from tokenloom.formats.native.reader import NATIVE_MANIFEST_VERSION, shards_dataset, validate_offsets
from tokenloom.formats.remote.blockfile import BlockFile
from tokenloom.formats.remote.cache import BlockCache
from tokenloom.formats.remote.client import ObjectInfo
from tokenloom.formats.remote.helper import head
from tokenloom.formats.remote.source import RemoteSource
from tokenloom.formats.remote.verify import fetch_manifest, log

__all__ = ["RemoteShard", "check_size", "open_remote_native"]


class RemoteShard(Shard):
    """A native shard whose ``.idx`` is fetched and validated on first touch; its tokens come from blocks."""

    source: RemoteSource  # pyright: ignore[reportIncompatibleVariableOverride]

    def __init__(
        self,
        cache: BlockCache,
        stem: str,
        dtype: np.dtype,
        entries: tuple[FileEntry, FileEntry],
        objects: tuple[ObjectInfo | None, ObjectInfo | None],
        *,
        validate: Validate,
        zero_overlaps: bool = False,
    ) -> None:
        idx_entry, bin_entry = entries
        #: the manifest records that every overlap prefix is 0 (writer or tokenize settings), so the
        #: ``.idx`` is not fetched to learn it (a window index over 10,000 shards would fetch them all)
        self.zero_overlaps = zero_overlaps
        #: its block cache, in the one place every remote shard keeps it (the ``.bin`` is added when first read)
        self.source = RemoteSource(cache, {})  # pyright: ignore[reportIncompatibleVariableOverride]
        self.name = stem
        self.dtype = dtype
        self.tokens_path = Path(cache.config.url.key(bin_entry.name))
        self.tokens_offset = 0
        self.num_tokens = bin_entry.bytes // dtype.itemsize
        self._num_entries = _entry_count(idx_entry, cache)
        self.entries = entries
        self.objects = list(objects)
        self.validate = validate
        self._index: tuple[np.ndarray, np.ndarray] | None = None
        self._tokens = None

    @property
    def num_entries(self) -> int:
        return self._num_entries

    def _object(self, slot: int) -> ObjectInfo:
        obj = self.objects[slot]
        if obj is None:  # a store that cannot list (http): learn the ETag now, once, and pin it
            entry = self.entries[slot]
            obj = self.objects[slot] = head(self.source.cache.config, entry.name)
            check_size(entry, obj)
        return obj

    def _load(self) -> tuple[np.ndarray, np.ndarray]:
        if self._index is None:
            idx_entry, _ = self.entries
            idx = self._object(0)
            raw = self.source.cache.whole(idx).read_bytes()
            if self.validate != Validate.NONE and xxhash.xxh3_128(raw).hexdigest() != idx_entry.xxh3_128:
                raise ChecksumError(
                    f"{idx_entry.name} differs from the checksum the manifest records",
                    path=idx.url,
                    hint="The index changed after the dataset was written: restore it or re-create the dataset",
                )
            found_dtype, count = parse_header(raw[: HEADER.size], path=idx.url, file_size=len(raw))
            if found_dtype != self.dtype:
                raise FormatError(
                    f"shard dtype {found_dtype.name} differs from the manifest's {self.dtype.name}",
                    path=idx.url,
                    field="dtype",
                )
            offsets = np.frombuffer(raw, dtype="<i8", count=count + 1, offset=HEADER.size).astype(np.int64)
            overlaps = np.frombuffer(raw, dtype="<u2", count=count, offset=HEADER.size + 8 * (count + 1))
            bin_url = self.source.cache.config.url.url(self.entries[1].name)
            validate_offsets(offsets, overlaps, self.num_tokens, idx_path=idx.url, bin_path=bin_url)
            if self.zero_overlaps and overlaps.any():
                raise IndexCorruptError(
                    f"{idx_entry.name} has overlap prefixes, but the manifest records none",
                    path=idx.url,
                    hint="The index or the manifest changed after the dataset was written: re-create the dataset",
                )
            self._index = (offsets, overlaps.astype(np.uint16))
        return self._index

    @property
    def offsets(self) -> np.ndarray:  # pyright: ignore[reportIncompatibleVariableOverride]
        return self._load()[0]

    @property
    def overlap_prefix(self) -> np.ndarray:  # pyright: ignore[reportIncompatibleVariableOverride]
        if self._index is None and self.zero_overlaps:
            return np.broadcast_to(np.zeros(1, dtype=np.uint16), (self._num_entries,))  # a constant zero index
        return self._load()[1]

    @property
    def tokens(self) -> Any:  # pyright: ignore[reportIncompatibleVariableOverride]
        if self._tokens is None:
            self.source.objects[os.fspath(self.tokens_path)] = self._object(1)
        return super().tokens

    def as_single_entry(self) -> RemoteShard:
        """The same tokens (same blocks) as one entry: the ``.idx`` is not needed, so it is not fetched."""
        bare = copy.copy(self)
        bare._index = (np.array([0, self.num_tokens], dtype=np.int64), np.zeros(1, dtype=np.uint16))
        bare._num_entries = 1
        return bare

    def __repr__(self) -> str:
        return f"RemoteShard({self.name!r}, {self.num_entries} entries, {self.num_tokens} tokens)"


def _entry_count(idx_entry: FileEntry, cache: BlockCache) -> int:
    """The entry count a GPT-Simple ``.idx`` of the recorded size holds (IndexCorruptError if none does)."""
    count, rest = divmod(idx_entry.bytes - HEADER.size - 8, 10)
    if rest or count < 0 or idx_size(count) != idx_entry.bytes:
        raise IndexCorruptError(
            f"the manifest records {idx_entry.bytes} bytes for {idx_entry.name}, not the size of any GPT-Simple index",
            path=cache.config.url.url(MANIFEST_NAME),
            field="files",
        )
    return count


def check_size(entry: FileEntry, obj: ObjectInfo) -> None:
    if obj.size != entry.bytes:
        raise ChecksumError(
            f"{entry.name} has {obj.size} bytes, the manifest records {entry.bytes}",
            path=obj.url,
            hint="The object changed after the dataset was written: restore it or re-create the dataset",
        )


def _manifest(cache: BlockCache, manifest_obj: ObjectInfo) -> Manifest:
    """The manifest, parsed and checked by the local reader (which reads a directory)."""
    whole, _ = fetch_manifest(cache, manifest_obj)
    folder = whole.parent / "as-dir"
    target = folder / MANIFEST_NAME
    if not target.exists() or target.read_bytes() != whole.read_bytes():  # a copy of a discarded bad one
        folder.mkdir(exist_ok=True)
        temp = folder / f"{MANIFEST_NAME}.{os.getpid()}-{os.urandom(4).hex()}.tmp"
        temp.write_bytes(whole.read_bytes())
        temp.replace(target)
    try:
        return read_manifest(folder)
    except FormatError as exc:
        raise type(exc)(exc.problem, path=manifest_obj.url, field=exc.field, hint=exc.hint) from None


def open_remote_native(
    cache: BlockCache, manifest_obj: ObjectInfo, listed: dict[str, ObjectInfo], *, validate: Validate, dtype: Any
) -> TokenDataset:
    """The native dataset at ``cache.config.url`` off its manifest (``FormatSpec.remote``): ``listed`` holds every
    object by relative name where the store lists (sizes checked here), nothing over http(s) (HEAD at first use)."""
    url = cache.config.url
    manifest = _manifest(cache, manifest_obj)
    if manifest.version != NATIVE_MANIFEST_VERSION:
        raise FormatError(
            f"manifest version {manifest.version}, expected {NATIVE_MANIFEST_VERSION}",
            path=manifest_obj.url,
            field="manifest_version",
        )
    token_dtype = as_token_dtype(manifest.dtype, field="manifest dtype")
    if dtype is not None and as_token_dtype(dtype) != token_dtype:
        raise ConfigError(
            f"dtype {as_token_dtype(dtype).name} was asked for, the manifest records {token_dtype.name}",
            path=str(url),
            field="dtype",
        )
    if listed:
        for entry in manifest.files:
            obj = listed.get(entry.name)
            if obj is None:
                raise MissingFileError(f"{entry.name} is listed in the manifest but absent", path=url.url(entry.name))
            check_size(entry, obj)
    by_name = {entry.name: entry for entry in manifest.files}
    zero = no_overlaps_recorded(manifest.metadata)
    shards: list[Shard] = []
    for entry in manifest.files:
        if not entry.name.endswith(".idx"):
            continue
        stem = entry.name[:-4]
        data = by_name.get(f"{stem}.bin")
        if data is None:
            raise MissingFileError(f"the manifest lists {entry.name} but not {stem}.bin", path=url.url(f"{stem}.bin"))
        objects = (listed.get(entry.name), listed.get(data.name))
        shards.append(
            RemoteShard(cache, stem, token_dtype, (entry, data), objects, validate=validate, zero_overlaps=zero)
        )
    if validate == Validate.DEEP:
        _check_every_byte(cache, manifest, shards)
    return shards_dataset(shards, manifest.format, Path(MANIFEST_NAME), manifest, validate)


def _check_every_byte(cache: BlockCache, manifest: Manifest, shards: list[Shard]) -> None:
    """Deep validation: every object read block by block and checked against the manifest's checksum."""
    stage = Stage("checksums", sum(e.bytes for e in manifest.files))
    by_name: dict[str, tuple[RemoteShard, int]] = {}
    for shard in shards:
        if isinstance(shard, RemoteShard):
            by_name[shard.entries[0].name] = (shard, 0)
            by_name[shard.entries[1].name] = (shard, 1)
    for entry in manifest.files:
        owner = by_name.get(entry.name)
        obj = owner[0]._object(owner[1]) if owner else head(cache.config, entry.name)
        if owner is None:
            check_size(entry, obj)
        with BlockFile(cache, obj) as handle:
            found = _checksum(handle, stage)
        if found != entry.xxh3_128:  # the cached copy or the object: fetch it all again to know which
            cache.discard(obj)
            with BlockFile(cache, obj) as handle:
                found = _checksum(handle, Stage("checksums (fetched again)", entry.bytes))
            if found == entry.xxh3_128:
                log.warning("%s: its cached blocks were corrupt; discarded and fetched again", obj.url)
        if found != entry.xxh3_128:
            raise ChecksumError(
                f"{entry.name} content checksum differs from the manifest's {entry.xxh3_128} "
                "(fetched afresh from the store)",
                path=obj.url,
                field="xxh3_128",
            )
    for shard in shards:
        shard.offsets  # noqa: B018 - fetch and validate every index


def _checksum(handle: BlockFile, stage: Stage) -> str:
    digest = xxhash.xxh3_128()
    buffer = bytearray(1 << 20)
    view = memoryview(buffer)
    while count := handle.readinto(buffer):
        digest.update(view[:count])
        stage.advance(count)
    return digest.hexdigest()
