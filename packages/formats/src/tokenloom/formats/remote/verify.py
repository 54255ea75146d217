"""What the block cache checks its bytes against: the manifest's block hashes and whole-file checksums.

A block fetched from the store is checked before it is published into the cache; a mismatch is fetched
again (:data:`FETCH_RETRIES` times: corruption on the way is transient), then a ChecksumError names the
URL, the block and both hashes. A cached block is checked the first time a process maps it; a mismatch
discards that cache file (one warning naming it) and fetches the block again: a cache can cost time,
never correctness.

Block hashes are recorded per 1 MiB (:mod:`tokenloom.formats.io.blockhash`); a cache block whose size is a
multiple of the recorded hash block (the default 8 MiB, or 1 MiB, 2 MiB, ...) is checked by the hash blocks
it covers. One whose size is not (``block_size=4096``) cannot be checked alone: the opener says so, once.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
from pathlib import Path
from typing import Any

import orjson
import xxhash

from tokenloom.formats.errors import ChecksumError, DataError
from tokenloom.formats.io.blockhash import BlockHashes
from tokenloom.formats.io.manifest import MANIFEST_NAME, content_checksum
from tokenloom.formats.io.source import data_suffixes

__all__ = ["FETCH_RETRIES", "Expected", "expect_files", "fetch_manifest"]

log = logging.getLogger("tokenloom.formats.remote")

#: a block or whole object whose bytes do not match is fetched again this many times before ChecksumError
FETCH_RETRIES = 2
#: bench-only switch (tools/bench): False skips every check, to measure what verification costs
ENABLED = True
_SAID: set[str] = set()


class Expected:
    """The hashes a cache checks objects against, by object key (pickled with the cache to workers)."""

    def __init__(self) -> None:
        self.blocks: dict[str, BlockHashes] = {}
        self.checksums: dict[str, str] = {}

    def add(self, key: str, *, blocks: BlockHashes | None = None, checksum: str | None = None) -> None:
        if blocks is not None:
            self.blocks[key] = blocks
        if checksum:
            self.checksums[key] = checksum

    def checks(self, key: str, block_size: int, whole: bool) -> bool:
        """True when the cache can check ``key``'s blocks (or, ``whole``, the whole object)."""
        if not ENABLED:
            return False
        if whole:
            return key in self.checksums
        hashes = self.blocks.get(key)
        return hashes is not None and block_size % hashes.block_size == 0

    def problem(self, url: str, key: str, data: Any, start: int, *, whole: bool) -> tuple[str, str, str] | None:
        """``(what, expected, actual)`` when ``data`` (bytes from ``start``) does not match, else None."""
        if whole:
            actual = xxhash.xxh3_128(data).hexdigest()
            expected = self.checksums[key]
            return None if actual == expected else ("its xxh3-128", expected, actual)
        found = self.blocks[key].mismatch(data, start)
        if found is None:
            return None
        first, expected, actual = found
        size = self.blocks[key].block_size
        return f"the xxh3-64 of bytes {first}-{first + min(size, len(data) - (first - start))}", expected, actual


def read_problem(expected: Expected, url: str, key: str, path: Path, start: int, whole: bool) -> Any:
    """:meth:`Expected.problem` of the file ``path`` (a fetched temp file, not yet published).

    Read through a populated read-only map: a quarter of the time of ``read_bytes`` (no copy), here.
    """
    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            return expected.problem(url, key, b"", start, whole=whole)
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        mapped = mmap.mmap(handle.fileno(), 0, flags=flags, prot=mmap.PROT_READ)
    try:
        view = memoryview(mapped)
        try:
            return expected.problem(url, key, view, start, whole=whole)
        finally:
            view.release()
    finally:
        mapped.close()


def fetch_error(
    url: str, name: str, start: int, end: int, problem: tuple[str, str, str], attempts: int
) -> ChecksumError:
    what, expected, actual = problem
    where = "the whole object" if name == "whole" else f"block {name} (bytes {start}-{end})"
    return ChecksumError(
        f"{where} was fetched {attempts} times and never matched the manifest: {what} is {actual}, "
        f"the manifest records {expected}",
        path=url,
        field="block_xxh3_64" if name != "whole" else "xxh3_128",
        hint="The object in the store differs from what the dataset's manifest records, or something between "
        "the store and this machine corrupts responses: restore the object (or re-create the dataset) and check "
        "any proxy on the way",
    )


def discard(path: Path, inode: int, problem: tuple[str, str, str]) -> None:
    """Delete the cached file ``path`` (when it is still the one checked, ``inode``) with one warning."""
    what, expected, actual = problem
    log.warning(
        "cached block %s is corrupt on disk (%s is %s, the manifest records %s): discarded, fetching it again",
        path,
        what,
        actual,
        expected,
    )
    _unlink_same(path, inode)


def _unlink_same(path: Path, inode: int) -> None:
    """Delete ``path`` unless another process has replaced it since it was read (a new inode)."""
    with contextlib.suppress(FileNotFoundError):
        if os.stat(path).st_ino == inode:
            os.unlink(path)


def expect_files(cache: Any, url: str, objects: dict[str, Any], payload: Any) -> None:
    """Register with ``cache`` what the manifest ``payload`` records (block hashes; checksums of what is not data)
    of ``objects`` (by relative name; empty: no listing, what the manifest lists); say once per dataset URL and
    process what stays unverified, and why."""
    recorded: dict[str, dict[str, Any]] = {}
    if isinstance(payload, dict) and isinstance(payload.get("files"), list):
        recorded = {str(f.get("name")): f for f in payload["files"] if isinstance(f, dict)}
    count = unhashed = unchecked = 0
    misaligned: set[int] = set()
    for name in objects or recorded:
        item = recorded.get(name, {})
        size = objects[name].size if objects else item.get("bytes")
        if name == MANIFEST_NAME or not isinstance(size, int):
            continue  # the manifest checks itself; a malformed entry is named by the format's reader
        blocks = None
        if item:  # data and index objects read by blocks (native's .idx) are checked by block
            with contextlib.suppress(DataError):  # the format's reader names a malformed manifest
                blocks = BlockHashes.from_json(item, size, path=url, record=0)
        checksum = item.get("xxh3_128") if isinstance(item.get("xxh3_128"), str) else None
        data = name.endswith(data_suffixes())
        cache.expected.add(cache.config.url.key(name), blocks=blocks, checksum=None if data else checksum)
        count += data
        unhashed += data and blocks is None
        unchecked += not data and not checksum and blocks is None
        if data and blocks is not None and cache.block_size % blocks.block_size:
            misaligned.add(blocks.block_size)
    reasons, hints = [], []
    if unhashed:
        reasons.append(f"{unhashed} of {count} data files have no block hashes in a manifest")
    if unchecked:
        reasons.append(f"{unchecked} index or metadata files have no block hashes or checksum in a manifest")
    if unhashed or unchecked:
        hints.append(
            "A tokenloom manifest records them: `tokenloom validate --write-manifest DIR` on a local copy, then "
            "upload its manifest.json (Megatron and packed files have none: `tokenloom convert` to native or flat)."
        )
    if misaligned:
        reasons.append(
            f"the cache block size {cache.block_size} is not a multiple of the manifest's hash block "
            f"{', '.join(map(str, sorted(misaligned)))}"
        )
        hints.append("Use a block_size (or TOKENLOOM_BLOCK_SIZE) that is a multiple of 1 MiB.")
    if not reasons or not ENABLED or url in _SAID:
        return
    _SAID.add(url)
    log.warning("%s: %s: those bytes are read unverified. %s", url, "; ".join(reasons), " ".join(hints))


def _self_check(raw: bytes) -> tuple[Any, tuple[str, str, str] | None]:
    """(the parsed manifest or None, its problem or None): a manifest must parse and match the checksum it
    records (one that records none, written before manifests had one, is taken as it is)."""
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None, ("its JSON", "a JSON object", "unparsable")
    if not isinstance(payload, dict):
        return None, ("its JSON", "a JSON object", type(payload).__name__)
    recorded = payload.get("checksum")
    if isinstance(recorded, str) and (actual := content_checksum(payload)) != recorded:
        return None, ("its own checksum", recorded, actual)
    return payload, None


def fetch_manifest(cache: Any, obj: Any) -> tuple[Path, Any]:
    """(the cached manifest, its JSON or None). Each fetched copy is checked against its own checksum before it is
    published to the node cache: a copy corrupt on the wire is fetched again and never seen by another process.
    A cached copy corrupt on disk is discarded and fetched again (:data:`FETCH_RETRIES` times). A JSON object whose
    own checksum stays wrong is damaged in the store: a named ChecksumError. One that is no JSON object (None) is
    left for the reader to name (an endpoint that is a web server, not a store, answers with such bytes). The
    manifest is what every other check trusts."""
    for attempt in range(FETCH_RETRIES + 1):
        path = cache.whole(obj, lambda fetched: _self_check(fetched.read_bytes())[1])
        inode = os.stat(path).st_ino
        payload, problem = _self_check(path.read_bytes())
        if problem is None:
            return path, payload
        if attempt == FETCH_RETRIES:
            if problem[0] != "its own checksum":
                return path, None
            _unlink_same(path, inode)  # the next open fetches it again (once the store holds a good copy)
            raise ChecksumError(
                f"manifest content checksum is {problem[2]}, the manifest records {problem[1]}, on every fetch",
                path=obj.url,
                field="checksum",
                hint="The stored manifest is damaged: upload a good copy (`tokenloom validate --write-manifest DIR` "
                "on a local copy writes one) or re-create the dataset",
            )
        log.warning(
            "%s: the cached manifest %s does not parse or does not match its own checksum: discarded, fetching it "
            "again (%d of %d)",
            obj.url,
            path,
            attempt + 1,
            FETCH_RETRIES,
        )
        _unlink_same(path, inode)
    raise AssertionError("unreachable")
