"""Object-store writes, run inside the helper process: put a local file, stat, delete.

A file is put with its xxh3-128 checksum as user metadata (``tokenloom-xxh3-128``), so a rerun can
tell an object it already uploaded (same size, same checksum) from one to upload again without
reading it back. Files larger than ``part_size`` go up as a multipart upload (obstore's ``put`` with
``chunk_size``); a fault anywhere in it retries the whole put under the same policy as reads
(backoff with jitter, 403/404 named at once). A put is atomic: an object is absent or whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenloom.formats.remote.client import StoreConfig, _obstore, _store, _with_retries, etag_of

__all__ = ["CHECKSUM_ATTRIBUTE", "DEFAULT_PART_SIZE", "delete", "put_file", "stat"]

#: user metadata holding the uploaded file's xxh3-128 (what a rerun compares instead of re-uploading)
CHECKSUM_ATTRIBUTE = "tokenloom_xxh3_128"
#: files larger than this are uploaded in parts of this size (S3's minimum part is 5 MiB)
DEFAULT_PART_SIZE = 16 << 20
_CONCURRENT_PARTS = 4


def put_file(
    config: StoreConfig, path: str, name: str, checksum: str, part_size: int = DEFAULT_PART_SIZE, *, once: bool = False
) -> Any:
    """Upload the local file ``path`` as ``name`` under the URL's prefix; its new ETag.

    ``once``: create ``name`` from the small file ``path`` unless it exists (If-None-Match: *), True if created,
    False if it did exist. The object-store form of an atomic create: two writers racing for one name never
    overwrite each other, and a retried create whose first attempt did land reports the object as existing (the
    caller compares).
    """
    url, size = config.url.url(name), Path(path).stat().st_size
    attributes = {CHECKSUM_ATTRIBUTE: checksum, "Content-Type": "application/octet-stream"}
    errors = _obstore().exceptions
    if once:
        data = Path(path).read_bytes()
        options: dict[str, Any] = {"mode": "create"}
    else:
        data, options = Path(path), {"use_multipart": size > part_size, "chunk_size": part_size}
        options["max_concurrency"] = _CONCURRENT_PARTS

    def attempt() -> Any:
        try:
            return _obstore().put(_store(config), config.url.key(name), data, attributes=attributes, **options)
        except (errors.AlreadyExistsError, errors.PreconditionError):
            if not once:
                raise
            return None

    result = _with_retries(config, url, "creating it once" if once else f"uploading {size} bytes", attempt)
    return result is not None if once else etag_of(result)


def stat(config: StoreConfig, name: str) -> dict[str, Any] | None:
    """Size, ETag and recorded checksum of ``name``, or None when it does not exist."""
    key = config.url.key(name)
    url = config.url.url(name)
    errors = _obstore().exceptions

    def once() -> dict[str, Any] | None:
        try:
            result = _obstore().get(_store(config), key, options={"head": True})
        except (FileNotFoundError, errors.NotFoundError):
            return None
        meta = result.meta
        return {
            "size": int(meta["size"]),
            "etag": etag_of(meta),
            "checksum": result.attributes.get(CHECKSUM_ATTRIBUTE),
        }

    return _with_retries(config, url, "reading its size and checksum", once)


def delete(config: StoreConfig, name: str) -> None:
    """Delete ``name`` under the URL's prefix (absent already is fine)."""
    key = config.url.key(name)
    errors = _obstore().exceptions

    def once() -> None:
        try:
            _obstore().delete(_store(config), key)
        except (FileNotFoundError, errors.NotFoundError):
            return

    _with_retries(config, config.url.url(name), "deleting it", once)
