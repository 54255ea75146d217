"""Opening any format from a URL: list the prefix, then run the format's own reader on a :class:`RemotePath`.

Detection works as on disk (the manifest first, else every detector over the listing); the reader stats,
globs and reads through the path (:mod:`.source`: the listing answers, the block cache serves the bytes),
and its fingerprint binds the reader's own fingerprint to every object's key, size and ETag. An index the
reader reads by blocks (native's ``.idx``: :class:`~tokenloom.formats.io.index_blocks.IndexBlocks` over the
:class:`RemotePath`) is fetched block by block when first touched, checked against the manifest's block hashes:
a 10^9-document dataset opens without reading its index.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import orjson
import xxhash

from tokenloom.formats._contract import FormatSpec, Validate, as_validate
from tokenloom.formats._dataset import TokenDataset
from tokenloom.formats.errors import ChecksumError, ConfigError, DataError, FormatError, MissingFileError
from tokenloom.formats.io.manifest import MANIFEST_NAME
from tokenloom.formats.io.source import data_suffixes, using_source
from tokenloom.formats.io.urls import RemoteURL
from tokenloom.formats.remote.cache import BlockCache
from tokenloom.formats.remote.client import ObjectInfo, StoreConfig
from tokenloom.formats.remote.helper import check_bucket, head, heads, list_objects
from tokenloom.formats.remote.options import RemoteOptions
from tokenloom.formats.remote.source import RemotePath, RemoteSource, RemoteTree, relative_name
from tokenloom.formats.remote.verify import expect_files, fetch_manifest, log

__all__ = ["FormatTable", "detect_remote", "manifest_format", "open_remote", "read_remote", "refuse_unknown"]


@dataclass(frozen=True)
class FormatTable:
    """The registry's lookups, handed in by ``tokenloom.formats`` (so that this module does not import it back)."""

    spec: Callable[[str], FormatSpec]
    detect: Callable[[Path], str]
    check_options: Callable[[FormatSpec, dict[str, Any]], None]
    available: Callable[[], dict[str, FormatSpec]]


def refuse_unknown(options: dict[str, Any], formats: FormatTable) -> None:
    """ConfigError, before any request, for a keyword no format's reader takes (a typo; a store or cache setting,
    which travels as ``remote=``; a loader's setting such as ``seq_len``), listing the accepted ones."""
    known = sorted({name for spec in formats.available().values() for name in spec.options})
    unknown = sorted(set(options) - set(known))
    if not unknown:
        return
    accepted = (
        "open_dataset takes format, dtype, validate, on_progress, remote (a RemoteOptions) and the formats' own "
        f"options: {', '.join(known)}"
    )
    store = [name for name in unknown if name in _STORE_KEYWORDS]
    if store:
        raise ConfigError(
            f"{', '.join(store)} is not a keyword of open_dataset: a URL's store and cache settings are one "
            "RemoteOptions value",
            field=store[0],
            hint="Pass remote=RemoteOptions(endpoint=..., block_cache_dir=..., cache_limit=...) (a settings dict: "
            f"remote=RemoteOptions.from_keywords(storage_options={{...}})); {accepted}",
        )
    raise ConfigError(
        f"{', '.join(unknown)} is not a keyword of open_dataset (it opens the token store; samples are cut by "
        "tokenloom.datasets)",
        field=unknown[0],
        hint=f"Pass it to the dataset that reads the store (MemoryMappedDataset(path, seq_len=...), ...); {accepted}",
    )


#: keywords of RemoteOptions and its from_keywords: a store or cache setting given loose to open_dataset
#: (read from RemoteOptions itself, so that a new setting needs no second list)
_STORE_KEYWORDS = frozenset(field.name for field in dataclasses.fields(RemoteOptions)) | frozenset(
    inspect.signature(RemoteOptions.from_keywords).parameters
)


#: what a single named file or Megatron prefix brings along: NAME, NAME.idx + NAME.bin, NAME.tokenloom.json
_COMPANIONS = ("", ".idx", ".bin", ".tokenloom.json")


def manifest_format(cache: BlockCache) -> tuple[ObjectInfo | None, Any]:
    """(the manifest object, its parsed JSON) at the URL's prefix, or (None, None) when there is none."""
    try:
        info = head(cache.config, MANIFEST_NAME)
    except MissingFileError:
        return None, None
    return info, fetch_manifest(cache, info)[1]  # None: not a JSON object, for the reader to name


def open_remote(
    url: str | os.PathLike[str], *, formats: FormatTable, remote: RemoteOptions | None = None, **options: Any
) -> TokenDataset:
    """Open the dataset at ``url`` through the per-node block cache, in any format (``options``: ``format``,
    ``dtype`` and ``validate`` as :func:`tokenloom.formats.open_dataset` takes them, and the reader's own).

    ``remote`` (a :class:`RemoteOptions`; None: the environment's store settings and cache) says how: the
    endpoint and credentials, ``block_cache_dir``, ``cache_limit`` (blocks are evicted by their next use in the
    readers' known future), ``block_size`` and the retry budget. The dataset returned carries it as
    ``dataset.remote``. ``formats``: the registry's lookups (``tokenloom.formats.open_dataset`` passes them; call
    that instead).
    """
    format, dtype = options.pop("format", None), options.pop("dtype", None)
    validate = as_validate(options.pop("validate", Validate.FAST))
    refuse_unknown(options, formats)  # storage_options=, block_cache_dir= (a URL's settings are remote=) or a typo
    settings = _settings(remote)
    dataset = _open(BlockCache.of(url, settings), format, dtype, validate, options, formats)
    dataset.remote = settings
    return dataset


def _settings(remote: Any) -> RemoteOptions:
    """``remote``, or the environment's defaults for None; ConfigError for anything but a RemoteOptions."""
    if remote is not None and not isinstance(remote, RemoteOptions):
        raise ConfigError(
            f"remote={remote!r:.80} is not a RemoteOptions",
            field="remote",
            hint="Pass remote=RemoteOptions(endpoint=..., block_cache_dir=...); a settings dict is "
            "remote=RemoteOptions.from_keywords(storage_options={...}, block_cache_dir=...)",
        )
    return remote if remote is not None else RemoteOptions()


def _open(
    cache: BlockCache, format: str | None, dtype: Any, validate: Validate, options: dict[str, Any], formats: FormatTable
) -> TokenDataset:
    """The dataset at ``cache.config.url`` in any registered format (see the module docstring)."""
    url = cache.config.url
    manifest, payload = manifest_format(cache)
    recorded = payload.get("format") if isinstance(payload, dict) else None
    named = format or (recorded if isinstance(recorded, str) else None)
    spec = formats.spec(named) if named else None
    if spec is not None and spec.manifest_required and manifest is not None and not isinstance(payload, dict):
        raise FormatError(
            "manifest is not a JSON object, on every fetch",
            path=manifest.url,
            hint="The stored manifest is damaged: upload a good copy (`tokenloom validate --write-manifest DIR` "
            "on a local copy writes one) or re-create the dataset",
        )

    def run(target: Path) -> TokenDataset:
        found = spec or formats.spec(formats.detect(target))
        if found.manifest_required and manifest is None:
            # in object storage the manifest is the commit marker: uploaded last, so shards without it are a
            # dataset still being written (or one written without it), never read as if complete
            raise MissingFileError(
                f"{url.url(MANIFEST_NAME)} does not exist: no {found.name} dataset at {url} ({found.name} files "
                "without their manifest are a dataset still being uploaded, or one written without it)",
                path=url.url(MANIFEST_NAME),
                hint="Wait for the upload to finish (the manifest is uploaded last), or run `tokenloom validate "
                "--write-manifest` on a local copy and upload its manifest.json",
            )
        formats.check_options(found, options)
        return found.open(target, validate=validate, dtype=dtype, **options)

    dataset, tree = _on_listing(cache, manifest, payload, validate, run)
    return _identified(dataset, url, tree.objects)


def read_remote(url: Any, read: Callable[[Path], Any], *, remote: RemoteOptions | None = None) -> Any:
    """``read(path)`` run on the :class:`RemotePath` of ``url``: for readers that are not a format's dataset reader
    (keyed and record stores, through :func:`tokenloom.formats.keyed.store.read_store`). What a manifest there
    records is verified. The object read is named by the URL as given (``.path``, never the node's local view)
    and keeps its options as ``.remote`` (``remote``, or the environment's defaults); it pickles with its block
    cache's settings, so a DataLoader worker reads the same objects the same way."""
    settings = _settings(remote)
    cache = BlockCache.of(url, settings)
    found = _on_listing(cache, *manifest_format(cache), Validate.FAST, read)[0]
    found.path = os.fspath(url)
    found.remote = settings
    return found


def _on_listing(
    cache: BlockCache, manifest: ObjectInfo | None, payload: Any, validate: Validate, run: Callable[[Path], Any]
) -> tuple[Any, RemoteTree]:
    """``run`` on the :class:`RemotePath` of the listing, with what a manifest there records registered to be
    checked. After a reader failed on the bytes (not on a setting of the call), the cached blocks no hash
    covers (a sidecar, a Megatron ``.idx``) are dropped, so the next open fetches them again: a byte flipped on
    the way costs one failed open, never every later one. An object whose checksum failed is fetched afresh once
    (its cached copy or the object: this tells which); when it then passes, its cached copy was corrupt."""
    config, objects, name = _objects(cache.config, manifest, payload)
    tree = RemoteTree(cache.at(config), objects)
    if validate != Validate.NONE:
        expect_files(tree.cache, cache.config.url.url(), objects, payload)
    try:
        with using_source(RemoteSource(tree.cache)):
            try:
                return run(RemotePath(tree, name)), tree  # pyright: ignore[reportArgumentType]
            except ChecksumError as exc:
                failed = [obj for obj in objects.values() if obj.url == exc.path]
                if not failed:
                    raise
                tree.cache.discard(failed[0])
                found = run(RemotePath(tree, name))  # pyright: ignore[reportArgumentType]
                log.warning("%s: its cached blocks were corrupt; discarded and fetched again", failed[0].url)
                return found, tree
    except DataError as exc:
        if not isinstance(exc, ConfigError):
            checks = tree.cache.expected.checks
            for obj in objects.values():
                if not checks(obj.key, cache.block_size, False) and not checks(obj.key, cache.block_size, True):
                    tree.cache.discard(obj)
        raise


def _identified(dataset: TokenDataset, url: RemoteURL, objects: dict[str, ObjectInfo]) -> TokenDataset:
    """``dataset`` named by its URL, its fingerprint bound to every object's key, size and ETag (no credentials)."""
    digest = xxhash.xxh3_128()
    digest.update((dataset.fingerprint or "").encode())
    for info in sorted(objects.values(), key=lambda o: o.key):
        digest.update(orjson.dumps([info.key, info.size, info.etag]))
    dataset.root = url.url()  # type: ignore[assignment]  # a URL, never a local Path
    dataset.fingerprint = digest.hexdigest()
    dataset.metadata["remote"] = {"url": url.url(), "objects": len(objects)}
    # each object's identity, so that a saved state can name the object that changed (no credentials)
    dataset.metadata["remote_objects"] = {info.url: f"{info.size}:{info.etag}" for info in objects.values()}
    return dataset


def _listing(config: StoreConfig) -> dict[str, ObjectInfo]:
    """Every object under the prefix by relative name (MissingFileError naming a missing bucket)."""
    try:
        listed = list_objects(config)
    except MissingFileError:
        check_bucket(config)  # the named error when the bucket itself is missing
        raise
    return {relative_name(o, config.url.prefix): o for o in listed if not o.key.endswith("/")}


def detect_remote(url: Any, *, formats: FormatTable, remote: RemoteOptions | None = None) -> str:
    """The format at ``url``: the manifest's, else the detectors run over the listing (a :class:`RemotePath`)."""
    cache = BlockCache.of(url, remote or RemoteOptions())
    manifest, payload = manifest_format(cache)
    recorded = payload.get("format") if isinstance(payload, dict) else None
    if isinstance(recorded, str):
        return recorded
    return _on_listing(cache, manifest, payload, Validate.NONE, formats.detect)[0]


def _objects(
    config: StoreConfig, manifest: ObjectInfo | None, payload: Any
) -> tuple[StoreConfig, dict[str, ObjectInfo], str]:
    """(config of the listed prefix, its objects by relative name, the name to open inside it or "")."""
    url = config.url
    listable = url.scheme not in ("http", "https")
    if manifest is not None and not listable:
        names = []  # the manifest was HEADed already (``manifest``); the files it lists are HEADed here
        if isinstance(payload, dict) and isinstance(payload.get("files"), list):
            names = [str(f.get("name")) for f in payload["files"] if isinstance(f, dict)]
        return config, {relative_name(o, url.prefix): o for o in [manifest, *heads(config, names)]}, ""
    if listable:
        listed = _listing(config)
        if listed:
            return config, listed, ""
    # a single file (x.pbin, train.h5) or a Megatron prefix: the listing is its parent's, holding it and companions
    parent = PurePosixPath(url.prefix).parent.as_posix() if "/" in url.prefix else ""
    basename = PurePosixPath(url.prefix).name
    parent_config = dataclasses.replace(config, url=RemoteURL(url.scheme, url.bucket, parent))
    kept = []  # HEADs, not a listing of the parent (which may be a whole bucket)
    for suffix in _COMPANIONS:
        if not suffix and not basename.endswith(data_suffixes()):
            continue  # only a file of a known kind is opened by name (an http server answers for folders too)
        try:
            kept.append(head(parent_config, basename + suffix))
        except MissingFileError:
            continue
    if not kept and not listable:
        raise MissingFileError(
            f"{url.url(MANIFEST_NAME)} does not exist, and an http(s) server cannot list {url}",
            path=url.url(MANIFEST_NAME),
            hint="Over http(s) a dataset needs its manifest.json (`tokenloom validate --write-manifest` on a local "
            "copy, then upload it), or name the file itself (https://HOST/DIR/data.pbin, .../train.h5)",
        )
    if not kept:
        check_bucket(config)
        raise MissingFileError(
            f"nothing at {url}: no object of that name and none under it",
            path=str(url),
            hint="Check the bucket and prefix; a dataset is a prefix (s3://BUCKET/DIR), a .pbin/.h5 object "
            "or a Megatron prefix (s3://BUCKET/DIR/NAME for NAME.idx + NAME.bin)",
        )
    return parent_config, {relative_name(o, parent): o for o in kept}, basename
