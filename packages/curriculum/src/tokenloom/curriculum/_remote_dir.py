"""A curriculum's data root in object storage: ``s3://bucket/data`` holding ``train/<bucket>/`` and ``val/<bucket>/``.

:class:`RemoteDir` gives a prefix the few directory operations the bucket discovery uses (``/``,
``name``, ``is_dir``, ``iterdir``) by listing the store, so a URL is never taken for a local path.
It carries one ``RemoteOptions`` (endpoint and credentials, which never show in ``str``/``repr`` or messages,
and the node-local block cache, default ``$TOKENLOOM_CACHE_DIR``) and hands it to every bucket it opens.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from tokenloom.formats import RemoteOptions
from tokenloom.formats.io import is_remote_url, parse_url

__all__ = ["RemoteDir", "as_data_root"]


class RemoteDir:
    """A prefix in object storage seen as a directory (folders = common prefixes, files = objects)."""

    def __init__(self, url: str, remote: RemoteOptions | None = None, *, kind: str | None = None) -> None:
        self.url = parse_url(url).url()  # normalised: s3://bucket/prefix, no trailing slash
        self.remote = remote if remote is not None else RemoteOptions()
        self._kind = kind  # "dir" / "file" when a listing of the parent said so
        self._listing: tuple[list[str], list[str]] | None = None

    def _child(self, name: str, kind: str | None = None) -> RemoteDir:
        return RemoteDir(f"{self.url}/{name}", self.remote, kind=kind)

    def __truediv__(self, name: str) -> RemoteDir:
        return self._child(str(name).strip("/"))

    @property
    def name(self) -> str:
        return parse_url(self.url).prefix.rsplit("/", 1)[-1]

    def listing(self) -> tuple[list[str], list[str]]:
        """(folders, files) directly under this prefix (listed once)."""
        if self._listing is None:
            from tokenloom.formats.remote.helper import list_dir

            self._listing = list_dir(self.remote.store(parse_url(self.url)))
        return self._listing

    def is_dir(self) -> bool:
        if self._kind is not None:
            return self._kind == "dir"
        folders, files = self.listing()
        return bool(folders or files)

    def is_file(self) -> bool:
        return self._kind == "file"

    def iterdir(self) -> Iterator[RemoteDir]:
        folders, files = self.listing()
        yield from (self._child(name, "dir") for name in folders)
        yield from (self._child(name, "file") for name in files)

    def __fspath__(self) -> str:
        return self.url  # for messages (DataError paths); is_remote_url() recognises it, never a local path

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"RemoteDir({self.url!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemoteDir) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_listing": None}


def as_data_root(path: object, remote: RemoteOptions | None = None) -> Path | RemoteDir:
    """``path`` as a local Path or, for a URL, a :class:`RemoteDir` with the store's options (``remote``, else
    the RemoteDir's own, else the environment's)."""
    if isinstance(path, RemoteDir):
        return RemoteDir(path.url, remote or path.remote)
    if is_remote_url(path):
        url = str(path if isinstance(path, str) else os.fspath(cast(os.PathLike[str], path)))
        return RemoteDir(url, remote or RemoteOptions())
    return Path(path)  # pyright: ignore[reportArgumentType]
