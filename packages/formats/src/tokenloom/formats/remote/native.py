"""Opening a native dataset (``manifest.json`` + ``.idx``/``.bin`` shards) from object storage.

The manifest and every ``.idx`` are fetched whole into the cache and validated exactly as on disk;
each ``.bin`` is read by blocks (:class:`BlockArray`). Every object's size is checked against the
manifest, and every object's ETag goes into the dataset fingerprint, so a state saved on these
bytes does not load on other bytes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import xxhash

from tokenloom.formats._contract import Validate
from tokenloom.formats._dataset import Shard, TokenDataset
from tokenloom.formats.errors import ChecksumError, ConfigError, FormatError, MissingFileError, TruncatedError
from tokenloom.formats.io.dtypes import as_token_dtype
from tokenloom.formats.io.manifest import MANIFEST_NAME, file_checksum, read_manifest
from tokenloom.formats.native.layout import HEADER, parse_header
from tokenloom.formats.native.reader import NATIVE_MANIFEST_VERSION, shards_dataset, validate_offsets
from tokenloom.formats.remote.array import BlockArray
from tokenloom.formats.remote.cache import BlockCache
from tokenloom.formats.remote.client import ObjectInfo
from tokenloom.formats.remote.helper import check_bucket, head

__all__ = ["RemoteShard", "open_remote_native"]


class RemoteShard(Shard):
    """A shard whose tokens come from the block cache instead of a local memory map."""

    array: BlockArray | None = None

    @property
    def tokens(self) -> Any:  # pyright: ignore[reportIncompatibleVariableOverride]
        return self.array


def _index_dir(cache: BlockCache, manifest: ObjectInfo) -> Path:
    """A local folder holding the fetched manifest (read_manifest reads a directory)."""
    whole = cache.whole(manifest)
    folder = whole.parent / "as-dir"
    target = folder / MANIFEST_NAME
    if not target.exists():
        folder.mkdir(exist_ok=True)
        temp = folder / f"{MANIFEST_NAME}.{os.getpid()}-{os.urandom(4).hex()}.tmp"
        temp.write_bytes(whole.read_bytes())
        temp.replace(target)
    return folder


def open_remote_native(cache: BlockCache, *, validate: Validate = Validate.FAST, dtype: Any = None) -> TokenDataset:
    """The TokenDataset of the native dataset at ``cache.config.url`` (manifest required)."""
    url = cache.config.url
    if validate == Validate.DEEP:
        raise ConfigError(
            f"deep validation of {url} is not supported yet (it would read every block)",
            field="validate",
            hint="Open with validate='fast', or copy the dataset to disk and run `tokenloom validate --deep` there",
        )
    try:
        manifest_obj = head(cache.config, MANIFEST_NAME)
    except MissingFileError:
        check_bucket(cache.config)
        raise MissingFileError(
            f"{url.url(MANIFEST_NAME)} does not exist: no native dataset at {url}",
            path=url.url(MANIFEST_NAME),
            hint="Reading from object storage needs the manifest (written by `tokenloom tokenize`); check the "
            "prefix, or run `tokenloom validate --write-manifest` on a local copy and upload it",
        ) from None
    local = _index_dir(cache, manifest_obj)
    manifest = read_manifest(local)
    if manifest.format != "native":
        raise FormatError(
            f"the manifest records format {manifest.format!r}; only native datasets are read remotely yet",
            path=manifest_obj.url,
            field="format",
            hint="Convert the dataset to native (`tokenloom convert`) or copy it to disk",
        )
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
    objects: dict[str, ObjectInfo] = {}
    for entry in manifest.files:
        info = head(cache.config, entry.name)
        if validate != Validate.NONE and info.size != entry.bytes:
            raise ChecksumError(
                f"{entry.name} has {info.size} bytes, the manifest records {entry.bytes}",
                path=info.url,
                hint="The object changed after the dataset was written: restore it or re-create the dataset",
            )
        objects[entry.name] = info
    if validate != Validate.NONE:
        for entry in manifest.files:
            if entry.role == "index" and file_checksum(cache.whole(objects[entry.name])) != entry.xxh3_128:
                raise ChecksumError(
                    f"{entry.name} differs from the checksum the manifest records",
                    path=objects[entry.name].url,
                    hint="The index changed after the dataset was written: restore it or re-create the dataset",
                )
    shards: list[Shard] = [_shard(cache, objects, stem, token_dtype) for stem in _stems(manifest)]
    dataset = shards_dataset(shards, "native", Path(MANIFEST_NAME), manifest, validate)
    dataset.root = url.url()  # type: ignore[assignment]  # a URL, never a local Path
    dataset.fingerprint = remote_fingerprint(manifest.fingerprint, objects.values())
    dataset.metadata["remote"] = {"url": url.url(), "objects": len(objects)}
    # each object's identity, so that a saved state can name the object that changed (no credentials)
    dataset.metadata["remote_objects"] = {info.url: f"{info.size}:{info.etag}" for info in objects.values()}
    return dataset


def _stems(manifest: Any) -> list[str]:
    return [f.name[:-4] for f in manifest.files if f.name.endswith(".idx")]


def _shard(cache: BlockCache, objects: dict[str, ObjectInfo], stem: str, dtype: np.dtype) -> RemoteShard:
    idx = objects.get(f"{stem}.idx")
    data = objects.get(f"{stem}.bin")
    if idx is None or data is None:
        missing = f"{stem}.idx" if idx is None else f"{stem}.bin"
        raise MissingFileError(f"the manifest does not list {missing}", path=cache.config.url.url(missing))
    raw = cache.whole(idx).read_bytes()
    found_dtype, count = parse_header(raw[: HEADER.size], path=idx.url, file_size=len(raw))
    if found_dtype != dtype:
        raise FormatError(
            f"shard dtype {found_dtype.name} differs from the manifest's {dtype.name}", path=idx.url, field="dtype"
        )
    offsets = np.frombuffer(raw, dtype="<i8", count=count + 1, offset=HEADER.size).astype(np.int64)
    overlaps = np.frombuffer(raw, dtype="<u2", count=count, offset=HEADER.size + 8 * (count + 1))
    if data.size % dtype.itemsize:
        raise TruncatedError(
            f"data object has {data.size} bytes, not a multiple of the {dtype.name} item size", path=data.url
        )
    num_tokens = data.size // dtype.itemsize
    validate_offsets(offsets, overlaps, num_tokens, idx_path=idx.url, bin_path=data.url)
    shard = RemoteShard(
        tokens_path=Path(data.key),
        dtype=dtype,
        num_tokens=num_tokens,
        offsets=offsets,
        overlap_prefix=overlaps.astype(np.uint16),
        name=stem,
    )
    shard.array = BlockArray(cache, data, dtype, 0, num_tokens)
    shard._tokens = shard.array  # type: ignore[assignment]  # the dataset's hot path reads _tokens directly
    return shard


def remote_fingerprint(manifest_fingerprint: str | None, objects: Any) -> str:
    """The manifest's fingerprint bound to every object's size and ETag (no credentials, no endpoint)."""
    digest = xxhash.xxh3_128()
    digest.update((manifest_fingerprint or "").encode())
    for info in sorted(objects, key=lambda o: o.key):
        digest.update(orjson.dumps([info.key, info.size, info.etag]))
    return digest.hexdigest()
