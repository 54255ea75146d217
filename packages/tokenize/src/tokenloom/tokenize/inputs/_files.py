"""An input file, and where it is read from: its own path, or, for an object-store input, a copy fetched at
first read."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenloom.formats import DataError, ResumeMismatchError
from tokenloom.formats.io import fsync_dir
from tokenloom.tokenize.inputs._registry import InputReader, sniff

__all__ = ["InputFile", "local_path", "named_by_url", "reader_of"]


@dataclass(frozen=True, slots=True)
class InputFile:
    """An input file and what identifies its content for resume checks."""

    path: Path
    relative: str
    size: int
    mtime_ns: int
    content_hash: str | None = None
    kind: InputReader | None = None
    """What the file holds by its magic bytes (None: look when it is read); not part of the run key."""
    url: str | None = None
    """An input in object storage: its URL; ``path`` is then where it is staged when first read."""
    etag: str | None = None
    """An input in object storage: its ETag (or version) when listed; part of the run key instead of the mtime."""
    remote: Any = field(default=None, repr=False, compare=False)
    """An input in object storage: ``(StoreConfig, ObjectInfo)`` to fetch it (never in the run key or a message)."""

    def to_json(self) -> dict[str, object]:
        if self.etag is not None:
            return {"path": self.relative, "size": self.size, "etag": self.etag}
        data: dict[str, object] = {"path": self.relative, "size": self.size, "mtime_ns": self.mtime_ns}
        if self.content_hash is not None:
            data["xxh3_128"] = self.content_hash
        return data

    @property
    def shown(self) -> str:
        """How messages name the input: its URL, or its path."""
        return self.url or str(self.path)


def local_path(info: InputFile) -> Path:
    """The local file to read for ``info``: its path; an object-store input is fetched there first (once).

    A staged copy is used only when it has the listed size (a copy cut short, by a crash after an unsynced
    rename or a full disk, is fetched again, never read as whole); a fetched copy is fsynced before its rename.
    """
    if info.url is None:
        return info.path
    if info.path.is_file() and info.path.stat().st_size == info.size:
        return info.path
    from tokenloom.formats.remote import helper

    config, obj = info.remote
    info.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = info.path.with_name(f".{info.path.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp")
    part = tmp.with_name(tmp.name + ".part")
    try:
        with open(tmp, "wb") as out:
            for start in range(0, info.size, _FETCH_BYTES):
                end = min(info.size, start + _FETCH_BYTES)
                try:
                    helper.fetch_into(config, obj, start, end, part)  # If-Match the listed ETag
                except ResumeMismatchError:
                    raise ResumeMismatchError(
                        f"input {info.url} was replaced after this run listed it (its ETag no longer matches)",
                        path=info.url,
                        hint="Restore the object, or start the run afresh so that the new object is listed (a new "
                        "--output-dir, or --overwrite; into object storage, an emptied prefix)",
                    ) from None
                with open(part, "rb") as piece:
                    out.write(piece.read())
                part.unlink()
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, info.path)
        fsync_dir(info.path.parent)
    finally:
        tmp.unlink(missing_ok=True)
        part.unlink(missing_ok=True)
    return info.path


@contextlib.contextmanager
def named_by_url(info: InputFile) -> Iterator[None]:
    """An error about an object-store input's staged copy (a mislabelled or cut file) names the object's URL."""
    try:
        yield
    except DataError as exc:
        if info.url is None or exc.path != os.fspath(info.path):
            raise
        raise type(exc)(
            exc.problem, path=info.url, offset=exc.offset, record=exc.record, field=exc.field, hint=exc.hint
        ) from None


#: an object-store input is fetched in ranges of this many bytes (the helper holds one range in memory)
_FETCH_BYTES = 64 << 20


def reader_of(info: InputFile) -> tuple[Path, InputReader]:
    """The local path of ``info`` (fetched first if remote) and its input reader (by its magic bytes)."""
    path = local_path(info)
    with named_by_url(info):
        return path, info.kind or sniff(path)
