"""Opening a native dataset (``manifest.json`` + ``.idx``/``.bin`` shards) from object storage, lazily.

At open only the manifest is fetched (plus one LIST per 1,000 objects where the store can list:
every object's size and ETag, checked against the manifest and bound into the fingerprint). Each
shard's entry count comes from its ``.idx`` size as the manifest records it (a GPT-Simple ``.idx`` of
``n`` entries has exactly ``idx_size(n)`` bytes), so a 10,000-shard dataset opens without reading
10,000 indexes, and a 10^9-entry one without reading its 10 GB index: the shards are the local reader's
:class:`~tokenloom.formats.native.reader.NativeShard`, whose ``.idx`` is read by blocks through
:func:`remote_index` (fetched into the block cache and checked against the manifest's block hashes when
first touched; a manifest without index block hashes: the whole ``.idx`` at first touch, against its
checksum); its ``.bin`` is read by blocks. ``validate="deep"`` touches every shard and checksums every
object block by block (with progress).

:func:`remote_index` is the one lazy index fetch path: any format's ``FormatSpec.remote`` reader gets an
index object as :class:`~tokenloom.formats.io.index_blocks.IndexBlocks` from it. Every ``.bin`` block is
checked against the manifest's block hashes when fetched and when a process first maps it (:mod:`.verify`);
what cannot be checked (a manifest written before block hashes, a cache block size that is not a multiple
of the hash block) is said once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from tokenloom.formats._contract import Validate
from tokenloom.formats._dataset import Shard, TokenDataset
from tokenloom.formats.errors import ChecksumError, ConfigError, FormatError, MissingFileError
from tokenloom.formats.io.dtypes import as_token_dtype
from tokenloom.formats.io.index_blocks import IndexBlocks
from tokenloom.formats.io.index_map import release_pages
from tokenloom.formats.io.manifest import MANIFEST_NAME, FileEntry, Manifest, read_manifest
from tokenloom.formats.io.progress import Stage
from tokenloom.formats.native.layout import no_overlaps_recorded
from tokenloom.formats.native.reader import NATIVE_MANIFEST_VERSION, NativeShard, native_shard, shards_dataset
from tokenloom.formats.remote.blockfile import BlockFile
from tokenloom.formats.remote.cache import BlockCache
from tokenloom.formats.remote.client import ObjectInfo
from tokenloom.formats.remote.helper import head
from tokenloom.formats.remote.source import RemoteSource
from tokenloom.formats.remote.verify import fetch_manifest, log

__all__ = ["RemoteObject", "RemoteShard", "check_size", "open_remote_native", "remote_index"]


class RemoteObject:
    """One object of a remote dataset as its manifest records it (``entry``); ``info``: its listing, or None where
    the store cannot list (http: HEADed at first use, its ETag then pinned). Reads come from the block cache."""

    def __init__(self, cache: BlockCache, entry: FileEntry, info: ObjectInfo | None) -> None:
        self.cache, self.entry, self._info = cache, entry, info

    def info(self) -> ObjectInfo:
        if self._info is None:
            self._info = head(self.cache.config, self.entry.name)
            check_size(self.entry, self._info)
        return self._info

    def read(self, start: int, stop: int) -> np.ndarray:
        """Bytes ``[start, stop)``, fetched by cache blocks (only those the range covers), copied out: this process
        keeps no page of those blocks (the cache checked all of a block when it first mapped it)."""
        obj, size = self.info(), self.cache.block_size
        found = np.empty(stop - start, dtype=np.uint8)
        for number in range(start // size, (stop - 1) // size + 1):
            block = np.frombuffer(self.cache.block(obj, number), dtype=np.uint8)
            first, last = max(start, number * size), min(stop, number * size + len(block))
            found[first - start : last - start] = block[first - number * size : last - number * size]
            release_pages(block, 0, len(block))
        return found

    def discard(self) -> None:
        self.cache.discard(self.info())


def remote_index(obj: RemoteObject) -> IndexBlocks:
    """``obj`` (an index object) read by blocks, each checked against the manifest when first touched."""
    entry = obj.entry
    url = obj.cache.config.url.url(entry.name)
    return IndexBlocks(url, entry.bytes, hashes=entry.blocks, checksum=entry.xxh3_128, fetch=obj)


class RemoteShard(NativeShard):
    """A :class:`NativeShard` whose ``.idx`` blocks are fetched on first touch and whose tokens come from blocks."""

    source: RemoteSource  # pyright: ignore[reportIncompatibleVariableOverride]
    #: the shard's ``.idx`` and ``.bin`` objects
    objects: tuple[RemoteObject, RemoteObject]

    @property
    def tokens(self) -> Any:  # pyright: ignore[reportIncompatibleVariableOverride]
        if self._tokens is None:
            self.source.objects[os.fspath(self.tokens_path)] = self.objects[1].info()
        return super().tokens

    def __repr__(self) -> str:
        return f"RemoteShard({self.name!r}, {self.num_entries} entries, {self.num_tokens} tokens)"


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
        objects = (RemoteObject(cache, entry, listed.get(entry.name)), RemoteObject(cache, data, listed.get(data.name)))
        if validate != Validate.NONE:  # the cache checks index blocks as data blocks: at fetch and first map
            cache.expected.add(url.key(entry.name), blocks=entry.blocks)
        tokens_path = Path(url.key(data.name))
        shard = native_shard(
            remote_index(objects[0]), tokens_path, data.bytes, name=stem, dtype=token_dtype, zero_overlaps=zero,
            cls=RemoteShard, record_path=url.url(MANIFEST_NAME),
        )  # fmt: skip
        shard.source, shard.objects = RemoteSource(cache, {}), objects  # its block cache: the one place it is kept
        shards.append(shard)
    if validate == Validate.DEEP:
        _check_every_byte(cache, manifest, shards)
    return shards_dataset(shards, manifest.format, Path(MANIFEST_NAME), manifest, validate)


def _check_every_byte(cache: BlockCache, manifest: Manifest, shards: list[Shard]) -> None:
    """Deep validation: every object read block by block and checked against the manifest's checksum."""
    stage = Stage("checksums", sum(e.bytes for e in manifest.files))
    by_name = {obj.entry.name: obj for shard in shards if isinstance(shard, RemoteShard) for obj in shard.objects}
    for entry in manifest.files:
        owner = by_name.get(entry.name)
        obj = owner.info() if owner else head(cache.config, entry.name)
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
        shard.offsets  # noqa: B018 - fetch and check every index block


def _checksum(handle: BlockFile, stage: Stage) -> str:
    digest = xxhash.xxh3_128()
    buffer = bytearray(1 << 20)
    view = memoryview(buffer)
    while count := handle.readinto(buffer):
        digest.update(view[:count])
        stage.advance(count)
    return digest.hexdigest()
