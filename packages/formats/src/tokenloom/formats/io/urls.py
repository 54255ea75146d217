"""Which dataset paths are object-store URLs: one function, asked before anything turns a path into a Path.

``Path("s3://bucket/ds")`` collapses the ``//`` into ``s3:/bucket/ds``, a relative local path; so a URL
is recognised from the string, and a URL already mangled that way (``s3:/bucket/ds``) is recognised too
and restored, never taken for a directory named ``s3:``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from tokenloom.formats.errors import ConfigError

__all__ = [
    "REMOTE_SCHEMES",
    "STORE_SCHEMES",
    "RemoteURL",
    "StoredPath",
    "is_remote_url",
    "parse_url",
    "refuse_remote_output",
]


class StoredPath:
    """A path that is not on a local filesystem (``tokenloom.formats.remote``'s ``RemotePath``): it answers the
    ``pathlib`` calls readers make (``exists``, ``stat``, ``glob``, ``walk``, ``open``) and serves its bytes
    itself (``open``, ``array``); ``os.fspath`` gives its URL, for messages."""

    __slots__ = ()
    open: Any  # open(mode="rb") -> a binary file object
    array: Any  # array(dtype, byte_offset, count) -> an array of those values
    index_dir: Any  # where indexes derived from it are cached (its block cache's folder)
    read: Any  # read(start, stop) -> those bytes, fetched by blocks (an index read by blocks)
    discard: Any  # discard() -> None: drop its cached copy (a block failed its check: fetched again)


#: the one scheme table. Object stores (obstore's ``from_url`` builds each): listed, read and written. Adding a
#: scheme obstore supports is one entry here.
STORE_SCHEMES = ("s3", "gs", "az", "abfs")
#: every scheme read through the remote layer: the stores, and read-only http(s) servers (a local mirror) that
#: cannot list
REMOTE_SCHEMES = (*STORE_SCHEMES, "https", "http")

_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*):/{1,2}(?P<rest>.*)$")


def _match(path: object) -> re.Match[str] | None:
    if not isinstance(path, (str, os.PathLike)) or isinstance(path, StoredPath):
        return None  # a StoredPath is an object-store path already opened (its fspath is its URL)
    text = os.fspath(path)
    if not isinstance(text, str):
        return None
    found = _URL.match(text)
    if found is None or found["scheme"].lower() not in REMOTE_SCHEMES:
        return None
    return found


def is_remote_url(path: object) -> bool:
    """True for ``s3://``, ``gs://``, ``az://``, ``https://`` (and ``http://``) URLs, also after a Path mangled them."""
    return _match(path) is not None


@dataclass(frozen=True, slots=True)
class RemoteURL:
    """A parsed dataset URL: ``scheme://bucket/prefix`` (for http(s): ``scheme://host[:port]/prefix``)."""

    scheme: str
    bucket: str
    prefix: str

    @property
    def root(self) -> str:
        """The store's root URL (what the client is built from): ``s3://bucket``, ``https://host``."""
        return f"{self.scheme}://{self.bucket}"

    def key(self, name: str) -> str:
        """The object key of ``name`` inside the prefix."""
        return f"{self.prefix}/{name}" if self.prefix else name

    def url(self, name: str = "") -> str:
        """The full URL of ``name`` inside the prefix (the prefix itself for ``""``)."""
        key = self.key(name) if name else self.prefix
        return f"{self.root}/{key}" if key else self.root

    def __str__(self) -> str:
        return self.url()


def parse_url(path: str | os.PathLike[str]) -> RemoteURL:
    """The :class:`RemoteURL` of ``path``; ConfigError for a URL without a bucket (or host)."""
    found = _match(path)
    if found is None:
        raise ConfigError(
            f"{os.fspath(path)!r} is not an object-store URL",
            field="path",
            hint=f"Use one of the schemes {', '.join(s + '://' for s in REMOTE_SCHEMES)}",
        )
    scheme = found["scheme"].lower()
    bucket, _, prefix = found["rest"].partition("/")
    if not bucket:
        raise ConfigError(
            f"{os.fspath(path)!r} names no bucket (or host)",
            field="path",
            hint=f"Write it as {scheme}://BUCKET/PREFIX",
        )
    dots = [segment for segment in prefix.split("/") if segment in (".", "..")]
    if dots:
        raise ConfigError(
            f"{os.fspath(path)!r} has a {dots[0]!r} segment: object keys are names, not paths, and the store "
            "would not resolve it",
            field="path",
            hint=f"Write the key without '.' and '..' segments ({scheme}://{bucket}/PREFIX/NAME)",
        )
    return RemoteURL(scheme, bucket, prefix.strip("/"))


def refuse_remote_output(path: object, what: str = "output") -> None:
    """ConfigError for a URL given as an output: remote writes do not exist yet (never a local dir ``s3:``)."""
    found = _match(path)
    if found is not None:
        shown = f"{found['scheme']}://{found['rest']}"
        raise ConfigError(
            f"remote {what} is not supported yet: {shown!r} is an object-store URL",
            field="output",
            hint="Write to a local directory, then upload it (`aws s3 sync DIR s3://BUCKET/PREFIX`, manifest last)",
        )
