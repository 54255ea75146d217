"""Sources in object storage and on the Hub: URLs, listing, identity and ranged reads.

``s3://``, ``gs://``, ``az://``, ``http(s)://`` and ``hf://datasets/ORG/NAME[@REVISION]/PATH`` (the Hub's
``{HF_ENDPOINT}/datasets/ORG/NAME/resolve/REVISION/PATH``, endpoint default ``https://huggingface.co``).
Every store call goes through tokenloom.formats' object-store helper process (obstore is not fork-safe):
a HEAD at construction gives each object's size and ETag, and every later read is a ranged GET sent
with If-Match that ETag, retried on transient faults from the byte already received. So a read can
neither mix two versions of an object nor restart it from its first byte.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from typing import Any
from urllib.parse import quote

from tokenloom.formats import ConfigError, MissingFileError, RemoteOptions
from tokenloom.formats.io import is_remote_url, parse_url, require
from tokenloom.formats.remote.blockfile import ObjectFile
from tokenloom.formats.remote.client import ObjectInfo, StoreConfig

__all__ = [
    "RangeReader",
    "expand_remote",
    "hub_url",
    "is_remote_source",
    "stat_remote",
]

_HF = "hf://"
_GLOB = re.compile(r"[*?\[]")
DEFAULT_HF_ENDPOINT = "https://huggingface.co"


def _helper() -> Any:
    require("obstore", distribution="tokenloom-hf-streaming", extra="remote", purpose="streaming from object storage")
    from tokenloom.formats.remote import helper

    return helper


def is_remote_source(path: object) -> bool:
    """A URL this package reads through the remote layer (``hf://`` too), never a local path."""
    if isinstance(path, str) and path.startswith(_HF):
        return True
    return is_remote_url(path)


def hub_url(url: str, endpoint: str | None = None) -> str:
    """``hf://datasets/ORG/NAME[@REV]/PATH`` -> ``{endpoint}/datasets/ORG/NAME/resolve/REV/PATH``."""
    rest = url[len(_HF) :]
    parts = rest.split("/")
    if len(parts) < 4 or parts[0] != "datasets" or not all(parts[1:4]):
        raise ConfigError(
            f"{url!r} is not a Hub dataset file URL",
            field="data_files",
            hint="Write it as hf://datasets/ORG/NAME/PATH (or hf://datasets/ORG/NAME@REVISION/PATH)",
        )
    org, name = parts[1], parts[2]
    name, _, revision = name.partition("@")
    revision = revision or "main"
    base = (endpoint or os.environ.get("HF_ENDPOINT") or "").rstrip("/")
    if not base:
        if os.environ.get("HF_HUB_OFFLINE") == "1":
            raise ConfigError(
                f"{url} is on the Hub, and the Hub is switched off (HF_HUB_OFFLINE=1)",
                path=url,
                field="data_files",
                hint="Unset HF_HUB_OFFLINE, or point HF_ENDPOINT at a mirror that serves the Hub's resolve URLs",
            )
        base = DEFAULT_HF_ENDPOINT
    path = "/".join(parts[3:])
    return f"{base}/datasets/{org}/{name}/resolve/{quote(revision, safe='')}/{path}"


def _root_and_key(url: str) -> tuple[str, str]:
    target = hub_url(url) if url.startswith(_HF) else url
    parsed = parse_url(target)
    if not parsed.prefix:
        raise ConfigError(f"{url!r} names no object", field="data_files", hint="Give the URL of a file")
    return parsed.root, parsed.prefix


def stat_remote(url: str, access: RemoteOptions) -> ObjectInfo:
    """HEAD ``url``: its identity as opened, named by the URL as given (a missing object: a MissingFileError)."""
    root, key = _root_and_key(url)
    info = _helper().head(access.store(parse_url(root)), key)
    return ObjectInfo(url=url, key=key, size=info.size, etag=info.etag)


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """glob semantics on keys: ``*`` and ``?`` stay inside one path segment, ``**`` crosses them."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out.append(re.escape("["))
                i += 1
            else:
                body = pattern[i + 1 : end]
                out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
                i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def expand_remote(pattern: str, access: RemoteOptions, *, suffixes: tuple[str, ...] = ()) -> list[str]:
    """The URLs a remote glob (or, with ``suffixes``, a prefix) names, in key order, by listing the store.

    Only stores that list (s3, gs, az) take globs; an http(s) or hf:// glob is a ConfigError.
    """
    if pattern.startswith(_HF) or parse_url(pattern).scheme in ("http", "https"):
        raise ConfigError(
            f"{pattern!r}: a plain HTTP server or the Hub cannot be listed here",
            path=pattern,
            field="data_files",
            hint="Name each file explicitly (a list of URLs); globs and prefixes work on s3://, gs:// and az://",
        )
    parsed = parse_url(pattern)
    key_pattern = parsed.prefix
    found = _GLOB.search(key_pattern)
    if found:
        literal = key_pattern[: found.start()]
        listed_prefix = literal[: literal.rfind("/") + 1]
        regex = _glob_regex(key_pattern)
        keep = lambda key: regex.match(key) is not None  # noqa: E731
    else:
        listed_prefix = key_pattern.rstrip("/") + "/" if key_pattern else ""
        keep = lambda key: key.lower().endswith(suffixes)  # noqa: E731
    listed = _helper().list_prefix(access.store(parse_url(parsed.root)), listed_prefix)
    urls = [f"{parsed.root}/{info.key}" for info in listed if keep(info.key) and info.size >= 0]
    if not urls:
        what = "the pattern" if found else f"the prefix (files ending {', '.join(suffixes)})"
        raise MissingFileError(f"{what} {pattern!r} matches no object", path=pattern, field="data_files")
    return urls


# -- ranged reads ------------------------------------------------------------------------------------------

_SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
_PREFIX = "tokenloom-stream-"
_SWEPT: set[int] = set()


def _sweep_dead() -> None:
    """Remove hand-over files of processes that died between the helper's write and the read (SIGKILL, a
    DataLoader worker ending with a read in flight): once per process, by the pid in their names."""
    pid = os.getpid()
    if pid in _SWEPT:
        return
    _SWEPT.add(pid)
    with contextlib.suppress(OSError):
        for name in os.listdir(_SCRATCH):
            owner = name[len(_PREFIX) :].split("-", 1)[0]
            if not name.startswith(_PREFIX) or not owner.isdigit():
                continue
            try:
                os.kill(int(owner), 0)
            except ProcessLookupError:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(_SCRATCH, name))
            except OSError:
                pass


class RangeReader(ObjectFile):
    """A seekable, read-only file over a remote object: every read is one ranged GET of exactly what is asked
    (If-Match its ETag; faults retried from the byte already received), no block cache (a stream reads once).

    Wrap it in ``io.BufferedReader(reader, size)`` for line reading (one GET per ``size`` bytes);
    pyarrow reads a parquet footer and then each row group's column chunks through it by range.
    """

    def __init__(self, obj: ObjectInfo, access: RemoteOptions) -> None:
        super().__init__(obj.url, obj.size)
        self.obj = obj
        self._store = access.store(parse_url(_root_and_key(obj.url)[0]))

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        start, end = self.position, min(self.size, self.position + len(view))
        if end <= start:
            return 0
        data = _fetch(self._store, self.obj, start, end)
        view[: len(data)] = data
        self.position += len(data)
        return len(data)


def _fetch(store: StoreConfig, obj: ObjectInfo, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of ``obj``, from obstore in this process, else through a hand-over file."""
    helper = _helper()
    _sweep_dead()  # also where no hand-over file is needed: other processes' leftovers go all the same
    if helper.in_process():  # a DataLoader worker calls obstore itself: the bytes need no hand-over file
        return helper.read_range(store, obj, start, end)
    # the helper writes the range into a fresh file (in memory where /dev/shm exists); it is read and removed
    fd, path = tempfile.mkstemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=_SCRATCH)
    os.close(fd)
    os.unlink(path)  # the helper creates it exclusively
    try:
        helper.fetch_into(store, obj, start, end, path)
        with open(path, "rb") as handle:
            return handle.read()
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
