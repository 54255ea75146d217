"""Publishing a dataset to object storage: staged locally, shards uploaded as they commit, the manifest last.

    writer -> CACHE/uploads/<hash of URL>/<hash of run key>/ (a local dataset, resumable as on disk)
           -> each committed file: put (skipped when the object already has its size and checksum)
           -> manifest.json (or the format's sidecar) last: until then a reader gets "no native dataset at URL"

A rerun after a kill finds the same staging directory (same URL, same run key), resumes the local
run, and uploads only what the store does not hold yet. An existing dataset at the URL (its manifest
present) is refused unless ``overwrite``; overwriting first deletes the old manifest, so no reader
ever pairs it with new shards, and afterwards removes the old dataset's leftover files (never a
file of another kind: those make the prefix refused).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

import orjson

from tokenloom.formats.errors import ConfigError, MissingFileError
from tokenloom.formats.io.manifest import MANIFEST_NAME, Manifest, file_checksum, read_manifest
from tokenloom.formats.io.urls import STORE_SCHEMES, RemoteURL, is_remote_url, parse_url
from tokenloom.formats.remote import helper
from tokenloom.formats.remote.cache import default_cache_dir
from tokenloom.formats.remote.options import RemoteOptions
from tokenloom.formats.remote.writes import DEFAULT_PART_SIZE

__all__ = ["RemoteTarget", "check_apart", "native_files", "staging_dir", "writable_url"]

log = logging.getLogger("tokenloom.formats.remote")


def writable_url(path: object, what: str) -> RemoteURL:
    """The parsed URL of an output; ConfigError for a scheme that cannot be written or a bucket root."""
    url = parse_url(os.fspath(path))  # type: ignore[arg-type]
    if url.scheme not in STORE_SCHEMES:
        raise ConfigError(
            f"{what} {str(url)!r}: {url.scheme}:// is read-only",
            field="output",
            hint=f"Write to {', '.join(s + '://' for s in STORE_SCHEMES)} or a local directory",
        )
    if not url.prefix:
        raise ConfigError(
            f"{what} {str(url)!r} is a bucket root; a dataset needs a prefix of its own",
            field="output",
            hint=f"Write it as {url.scheme}://{url.bucket}/NAME",
        )
    return url


def check_apart(target: RemoteURL, sources: Iterable[object], target_name: str) -> None:
    """ConfigError when the target URL is, holds, or lies inside a source URL (an overwrite would delete it)."""
    for source in sources:
        if not is_remote_url(source):
            continue
        other = parse_url(os.fspath(source))  # type: ignore[arg-type]
        if other.root != target.root:
            continue
        a, b = f"{target.prefix}/", f"{other.prefix}/"
        if a.startswith(b) or b.startswith(a):
            raise ConfigError(
                f"{target_name} {target} overlaps the source {other}",
                field="output",
                hint="Choose a target prefix apart from the source",
            )


def staging_dir(url: RemoteURL, key: object, plan_cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``PLAN_CACHE/uploads/<hash of URL>/<hash of key>``: where a dataset for ``url`` is built before upload
    (``plan_cache_dir``: the run's plan cache, as tokenize's and convert's ``plan_cache_dir``; None:
    :func:`~tokenloom.formats.remote.cache.default_cache_dir`)."""
    root = Path(plan_cache_dir) if plan_cache_dir is not None else default_cache_dir()
    url_hash = hashlib.sha256(str(url).encode()).hexdigest()[:24]
    key_hash = hashlib.sha256(orjson.dumps(key, option=orjson.OPT_SORT_KEYS)).hexdigest()[:24]
    return root / "uploads" / url_hash / key_hash


class RemoteTarget:
    """One output prefix in a store: what it holds, and uploads that skip what is already there."""

    def __init__(self, url: RemoteURL, remote: RemoteOptions | None = None, part_size: int = DEFAULT_PART_SIZE) -> None:
        """``remote``: the store's RemoteOptions (None: the environment's); files above ``part_size`` go up in parts."""
        self.url = url
        self.config = (remote or RemoteOptions()).store(url)
        self.part_size = part_size

    def existing(self) -> list[str]:
        """Names of the objects directly under the prefix (a missing bucket is a named error)."""
        try:
            return helper.list_dir(self.config)[1]
        except MissingFileError:
            helper.check_bucket(self.config)
            raise

    def read_manifest(self) -> Manifest | None:
        """The manifest at the URL, parsed and self-checked, or None when there is none."""
        if helper.stat(self.config, MANIFEST_NAME) is None:
            return None
        obj = helper.head(self.config, MANIFEST_NAME)
        folder = staging_dir(self.url, "manifest-reads") / f"{os.getpid()}-{os.urandom(4).hex()}"
        folder.mkdir(parents=True)
        try:
            helper.fetch_into(self.config, obj, 0, obj.size, folder / MANIFEST_NAME)
            return read_manifest(folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def upload(self, path: Path, name: str | None = None, checksum: str | None = None) -> bool:
        """Put ``path`` as ``name`` unless the object already has its size and checksum; True if put."""
        name = name or path.name
        checksum = checksum or file_checksum(path)
        size = path.stat().st_size
        there = helper.stat(self.config, name)
        if there is not None and there["size"] == size and there["checksum"] == checksum:
            return False
        helper.put_file(self.config, path, name, checksum, self.part_size)
        log.debug("%s: uploaded %s (%d bytes)", self.url, name, size)  # one line per run, not per shard (--debug)
        return True

    def delete(self, name: str) -> None:
        helper.delete(self.config, name)

    def remove_stale(self, keep: Iterable[str], ours: Callable[[str], bool]) -> list[str]:
        """Delete the objects under the prefix that ``ours`` claims and ``keep`` does not list."""
        keep = set(keep)
        removed = [name for name in self.existing() if ours(name) and name not in keep]
        for name in removed:
            self.delete(name)
        return removed


_SHARD = re.compile(r"shard_\d+\.(bin|idx)")


def native_files(name: str) -> bool:
    """Names a native dataset writer puts under its prefix (what an overwrite may remove)."""
    return name == MANIFEST_NAME or _SHARD.fullmatch(name) is not None
