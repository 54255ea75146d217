"""The input readers by name, told apart by their magic bytes; a file's suffix must agree.

A suffix alone is a promise the file may not keep (a ``.jsonl`` that is really
gzip, a ``.parquet`` that is a jsonl dump): reading it by its name would turn
every line into a malformed-JSON record, or fail deep inside a library. The
first bytes decide, and a name that disagrees is a FormatError naming both.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from tokenloom.formats import ConfigError, FormatError, TruncatedError
from tokenloom.formats.io import require, storage_error

__all__ = [
    "Cut",
    "InputReader",
    "claimed_format",
    "detect",
    "format_named",
    "input_suffixes",
    "readers",
    "register",
    "require_corpus_extra",
    "sniff",
]


class Cut(StrEnum):
    """How a large input is cut into units that are read independently."""

    BYTES = "bytes"
    """Line-aligned byte ranges (an uncompressed line format)."""
    ROW_GROUPS = "row groups"
    """Runs of whole row groups (their sizes from the footer)."""
    WHOLE = "whole"
    """Never cut (a compressed stream cannot be entered in the middle)."""


class InputReader(Protocol):
    """One corpus kind: how it is recognised, cut and opened. A module registers one with :func:`register`.

    A line format's ``open(raw)`` returns the decompressed byte stream over a binary file object (its
    lines are cut by the shared bounded line reader); a row format's ``open(path_or_file, **options)``
    returns a :class:`~tokenloom.tokenize.inputs.RowFile` (row groups or record batches as units).
    A reader class subclasses this protocol explicitly (so that it pickles by name).
    """

    name: str
    """How messages name the kind ("zstd-compressed jsonl")."""
    suffixes: tuple[str, ...]
    """File name endings that promise this kind; the first is the one a rename hint suggests."""
    magic: tuple[bytes, ...] = ()
    """Leading bytes of a file of this kind; () for the plain-text kind every other file is."""
    trailer: bytes = b""
    """Bytes a whole file ends with (a parquet footer's ``PAR1``), if any."""
    rows: bool = False
    """Records are table rows (parquet, Arrow), not lines."""
    cut: Cut = Cut.WHOLE
    stream_name: str = ""
    """The compression a cut stream is named by ("gzip", "zstd"); "" for an uncompressed kind."""
    stream_errors: tuple[type[BaseException], ...] = ()
    """What its decompressor raises on a cut or corrupt stream."""

    def open(self, source: Any, **options: Any) -> Any: ...

    def open_remote(self, source: Any, *, shown: Any, reuse: Any = None) -> Any:
        """A row format's RowFile over ranged reads of an object (``source``: a seekable file object). ``reuse``:
        what an earlier open of the same object left in its ``reusable`` attribute (parquet: the parsed footer),
        so a reader decides its own open options; another format ignores parquet's."""
        return self.open(source, shown=shown)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by name: a worker's copy is the registered reader itself (``is`` comparisons hold)."""
        return (format_named, (self.name,))


_READERS: dict[str, InputReader] = {}


def register(reader: InputReader) -> InputReader:
    """Add (or replace, by name) an input reader: one line per corpus kind, in its module."""
    _READERS[reader.name] = reader
    return reader


def unregister(name: str) -> None:
    """Remove the reader registered as ``name`` (a test's, or a plugin's that is unloaded); unknown names pass."""
    _READERS.pop(name, None)


def readers() -> tuple[InputReader, ...]:
    return tuple(_READERS.values())


def input_suffixes() -> tuple[str, ...]:
    """Inputs are found by these suffixes (the content must agree, see :func:`sniff`)."""
    return tuple(suffix for reader in _READERS.values() for suffix in reader.suffixes)


def format_named(name: str) -> InputReader:
    try:
        return _READERS[name]
    except KeyError:
        raise ConfigError(
            f"unknown input kind {name!r}; known kinds are {', '.join(map(repr, _READERS))}", field="input_kind"
        ) from None


def claimed_format(name: str) -> InputReader | None:
    """The kind a file name promises (longest matching suffix), or None if it is not an input name."""
    found = [(len(suffix), r) for r in _READERS.values() for suffix in r.suffixes if name.endswith(suffix)]
    return max(found, key=lambda pair: pair[0])[1] if found else None


def detect(head: bytes) -> InputReader:
    """The kind whose magic bytes start ``head`` (the longest match), else the plain-text kind."""
    found = [(len(magic), r) for r in _READERS.values() for magic in r.magic if head.startswith(magic)]
    if found:
        return max(found, key=lambda pair: pair[0])[1]
    plain = next((r for r in _READERS.values() if not r.magic), None)
    if plain is None:
        raise ConfigError("no plain-text input reader is registered", field="input_kind")
    return plain


def sniff(path: Path) -> InputReader:
    """The kind of ``path`` by its magic bytes; a FormatError if its suffix says otherwise.

    An empty file is what its name says (the reader reports it as an empty input). A kind with a
    trailer (parquet's ``PAR1``) must also end with it: without it the footer is missing (a cut copy).
    """
    try:
        with open(path, "rb") as handle:
            return sniff_file(handle, path.name, path)
    except OSError as exc:
        raise storage_error(exc, path, "reading an input file's first bytes") from exc


def sniff_file(handle: Any, name: str, path: Any) -> InputReader:
    """:func:`sniff` over a seekable binary file object called ``name`` (a remote object's reads: two ranged
    GETs), ``path`` as messages show it."""
    claimed = claimed_format(name)
    head = handle.read(8)
    size = handle.seek(0, 2)
    tail = b""
    if size >= 8:
        handle.seek(size - 4)
        tail = handle.read(4)
    if not head:
        return claimed or detect(b"")
    found = detect(head)
    if claimed is not None and found is not claimed:
        names = ", ".join(r.stream_name or r.name for r in _READERS.values() if r.magic)
        holds = f"plain text (no {names} magic)" if not found.magic else found.name
        raise FormatError(
            f"input {name} is named as {claimed.name} but its first bytes ({head[:4].hex(' ')}) are {holds}",
            path=path,
            offset=0,
            hint=f"Rename it to end in {found.suffixes[0]} if the content is right, or replace it with the file "
            "its name promises",
        )
    if found.trailer and tail != found.trailer:
        raise TruncatedError(
            f"{found.name} file of {size} bytes does not end with the {found.trailer.decode()} magic: its footer "
            "is missing (a cut or partial copy)",
            path=path,
            offset=max(size - 4, 0),
            hint="Copy or download the file again; nothing was written",
        )
    return found


def require_corpus_extra(module: str, reader: InputReader) -> Any:
    """Import zstandard or pyarrow, or name the extra that installs them."""
    return require(module, distribution="tokenloom-tokenize", extra="corpus", purpose=f"Reading {reader.name} input")
