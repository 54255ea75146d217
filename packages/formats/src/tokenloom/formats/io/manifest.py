"""manifest.json: the self-checking list of what a complete dataset holds.

Written last by every writer, so its presence means "complete". It records the
format, dtype, vocab size, EOS id, tokenizer fingerprint, token and document
counts, every file with its byte size, xxh3-128 checksum and an xxh3-64 per 1 MiB
block (:mod:`.blockhash`: a reader verifies each block it fetches or first touches, so
neither a remote read nor the open of a 10^9-entry index reads a whole file), free-form
``metadata`` (the settings that produced the data), and a ``checksum`` of the
manifest's own canonical content, so a flipped byte in the manifest is caught.
"""

from __future__ import annotations

import dataclasses
import io
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import xxhash

from tokenloom.formats.errors import ChecksumError, FormatError, MissingFileError
from tokenloom.formats.io.atomic import atomic_write_bytes
from tokenloom.formats.io.blockhash import BlockHashes, file_digests
from tokenloom.formats.io.index_map import checked_before, remember_checked
from tokenloom.formats.io.paths import as_path, safe_stat
from tokenloom.formats.io.progress import Stage
from tokenloom.formats.io.source import LOCAL, current_source
from tokenloom.formats.io.urls import StoredPath

__all__ = [
    "EOS_AT_DOCUMENT_END",
    "EOS_PLACEMENT",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "add_block_hashes",
    "READABLE_MANIFEST_VERSIONS",
    "content_checksum",
    "FileEntry",
    "Manifest",
    "describe_file",
    "describe_files",
    "file_checksum",
    "manifest_names_format",
    "read_manifest",
    "write_manifest",
]

#: Metadata key saying where the EOS id stands: absent (every entry ends with it, tokenloom's
#: rule) or EOS_AT_DOCUMENT_END (only entries that reach a document's end: GPT-Simple's windowing).
EOS_PLACEMENT = "eos_placement"
EOS_AT_DOCUMENT_END = "document_end"

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 2
#: 1: native shards in tokenloom's pre-release .idx layout (flat: unchanged); 2: native shards in GPT-Simple's layout.
READABLE_MANIFEST_VERSIONS = (1, 2)
_CHUNK = 1 << 20


def manifest_names_format(directory: Path, format_name: str) -> bool | None:
    """Detection's quick look: whether ``directory``'s manifest says ``format_name`` (None: no manifest).

    An unreadable manifest counts as "not this format"; opening it names the real problem.
    """
    manifest = directory / MANIFEST_NAME
    if not manifest.is_file():
        return None
    try:
        return f'"format":"{format_name}"'.encode() in manifest.read_bytes().replace(b" ", b"")
    except OSError:
        return False


def file_checksum(path: str | os.PathLike[str], *, on_bytes: Callable[[int], None] | None = None) -> str:
    """xxh3-128 of a file's bytes, hex (read through one reused 1 MiB buffer: constant memory).

    ``on_bytes(n)`` is called after every chunk read (progress of a long verification).
    """
    digest = xxhash.xxh3_128()
    source = current_source()
    local = source is LOCAL and not isinstance(path, StoredPath)
    opened: Any = open(path, "rb", buffering=0) if local else source.open(path)  # noqa: SIM115
    with opened as handle:
        try:  # a small file gets a buffer of its size: a zeroed 1 MiB each costs more than reading 1,000 indexes
            size = os.fstat(handle.fileno()).st_size
        except (OSError, AttributeError, io.UnsupportedOperation):
            size = _CHUNK
        buffer = bytearray(min(max(size, 1), _CHUNK))
        view = memoryview(buffer)
        while count := handle.readinto(buffer):
            digest.update(view[:count])
            if on_bytes is not None:
                on_bytes(count)
    return digest.hexdigest()


def content_checksum(payload: dict[str, Any]) -> str:
    """The xxh3-128 of a manifest's canonical content (every field but ``checksum``): what it records as
    ``checksum``. Every reader checks it with this one function (a remote one before it trusts the manifest)."""
    body = {k: v for k, v in payload.items() if k != "checksum"}
    return xxhash.xxh3_128(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _serialise(payload: dict[str, Any]) -> bytes:
    """The exact bytes of manifest.json: readers refuse any other spelling, so every changed byte is caught."""
    return orjson.dumps(payload, option=orjson.OPT_INDENT_2)


@dataclass(frozen=True, slots=True)
class FileEntry:
    """A file of the dataset, relative to its root."""

    name: str
    bytes: int
    xxh3_128: str
    role: str = "data"  # "data" (large, checked in deep mode) or "index" (small, checked always)
    #: an xxh3-64 per block (data files; index files since the open by blocks; None in older manifests)
    blocks: BlockHashes | None = None

    def to_json(self) -> dict[str, Any]:
        found = {"name": self.name, "bytes": self.bytes, "xxh3_128": self.xxh3_128, "role": self.role}
        return found if self.blocks is None else {**found, **self.blocks.to_json()}


@dataclass(frozen=True, slots=True)
class Manifest:
    """The content of manifest.json (see the module docstring)."""

    format: str
    dtype: str
    num_tokens: int
    num_documents: int
    files: tuple[FileEntry, ...]
    vocab_size: int | None = None
    eos_id: int | None = None
    tokenizer_fingerprint: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    checksum: str = ""
    version: int = MANIFEST_VERSION

    def payload(self) -> dict[str, Any]:
        return {
            "manifest_version": self.version,
            "format": self.format,
            "dtype": self.dtype,
            "num_tokens": self.num_tokens,
            "num_documents": self.num_documents,
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "tokenizer_fingerprint": self.tokenizer_fingerprint,
            "files": [f.to_json() for f in self.files],
            "metadata": self.metadata,
        }

    @property
    def fingerprint(self) -> str:
        """A stable id of this dataset's content (the manifest's own checksum, block hashes left out: adding
        them with ``tokenloom validate --write-manifest`` keeps the fingerprint, and saved states resume; a
        remote dataset's fingerprint also binds the manifest object's ETag, which an upload changes)."""
        if self.checksum and all(f.blocks is None for f in self.files):
            return self.checksum
        payload = self.payload()
        payload["files"] = [
            {"name": f.name, "bytes": f.bytes, "xxh3_128": f.xxh3_128, "role": f.role} for f in self.files
        ]
        return content_checksum(payload)

    def file(self, name: str) -> FileEntry:
        for entry in self.files:
            if entry.name == name:
                return entry
        raise MissingFileError(f"{name} is not listed in the manifest", field="files")

    def verify(self, root: Path, *, deep: bool, index_blocks: bool = False) -> dict[str, os.stat_result]:
        """Sizes of every file; checksums of index files always and of data files when ``deep``.

        ``index_blocks``: the reader checks each index block it touches against its block hashes (index files
        with block hashes are then not read here: a 10^9-entry index is not read at open).

        An index file's checksum is read once per version of the file, and all of them are looked up
        at once when every index file is a version seen before (see
        :func:`~tokenloom.formats.io.index_map.remember_checked`); ``deep`` reads every file again.
        Returns each listed file's stat (symlinks followed) by name, so a reader need not stat it again.
        """
        folder = os.path.join(root, "")  # ends with a separator: + name is a child path (faster than join)
        stored = isinstance(root, StoredPath)  # an object store's listing: paths of its own kind

        def child(name: str) -> Any:
            return root / name if stored else folder + name  # a plain name: read_manifest refuses others

        infos: dict[str, os.stat_result] = {}
        for entry in self.files:
            path = child(entry.name)
            try:
                info = safe_stat(root, path)
            except MissingFileError:
                if os.path.islink(path):  # a dangling link: safe_stat's own message says so
                    raise
                raise MissingFileError(f"{entry.name} is listed in the manifest but absent", path=path) from None
            if info.st_size != entry.bytes:
                raise ChecksumError(
                    f"{entry.name} has {info.st_size} bytes, the manifest recorded {entry.bytes}",
                    path=path,
                    field="bytes",
                )
            infos[entry.name] = info
        if deep:
            stage = Stage("checksums", sum(e.bytes for e in self.files))
            for entry in self.files:
                self._check_checksum(child(entry.name), entry, infos[entry.name], on_bytes=stage.advance)
            return infos
        indexes = [e for e in self.files if e.role == "index" and not (index_blocks and e.blocks is not None)]
        paths = [child(entry.name) for entry in indexes]
        versions = [infos[entry.name] for entry in indexes]
        recorded = xxhash.xxh3_128("\0".join(entry.xxh3_128 for entry in indexes).encode()).hexdigest()
        every_index = f"xxh3_128 of {len(indexes)} index files: {recorded}"
        if not indexes or checked_before(paths, every_index, versions):
            return infos
        for entry, path, info in zip(indexes, paths, versions, strict=True):
            if not checked_before([path], f"xxh3_128 {entry.xxh3_128}", [info]):
                self._check_checksum(path, entry, info)
        remember_checked(paths, every_index, versions)
        return infos

    @staticmethod
    def _check_checksum(
        path: Any, entry: FileEntry, info: os.stat_result, *, on_bytes: Callable[[int], None] | None = None
    ) -> None:
        """ChecksumError unless the file's xxh3-128 is the recorded one; remembered for this version of it."""
        if file_checksum(path, on_bytes=on_bytes) != entry.xxh3_128:
            raise ChecksumError(
                f"{entry.name} content checksum differs from the manifest's {entry.xxh3_128}",
                path=path,
                field="xxh3_128",
            )
        remember_checked([path], f"xxh3_128 {entry.xxh3_128}", [info])


def describe_files(root: Path, names_and_roles: Iterable[tuple[str, str]]) -> tuple[FileEntry, ...]:
    """FileEntry for each (name, role), measuring size and checksum from disk (data files: block hashes too)."""
    return tuple(describe_file(root, name, role) for name, role in names_and_roles)


def describe_file(root: Path, name: str, role: str) -> FileEntry:
    """The FileEntry of ``root/name``: size, xxh3-128 and its block hashes (one read)."""
    size = (root / name).stat().st_size
    checksum, blocks = file_digests(root / name)  # index files too: a reader checks the blocks it touches
    return FileEntry(name=name, bytes=size, xxh3_128=checksum, role=role, blocks=blocks)


def add_block_hashes(root: str | os.PathLike[str], manifest: Manifest) -> tuple[Manifest, int]:
    """Rewrite ``root``'s manifest with block hashes for every data or index file that has none; (manifest, added).

    Each such file is read once: its checksum must be the recorded one (ChecksumError otherwise: hashes of
    damaged data would bless it), and its block hashes come from the same read.
    """
    folder = Path(root)
    files, added = [], 0
    for entry in manifest.files:
        if entry.role not in ("data", "index") or entry.blocks is not None:
            files.append(entry)
            continue
        checksum, blocks = file_digests(folder / entry.name)
        if checksum != entry.xxh3_128:
            raise ChecksumError(
                f"{entry.name} content checksum {checksum} differs from the manifest's {entry.xxh3_128}",
                path=folder / entry.name,
                field="xxh3_128",
                hint="The file changed after the dataset was written: restore it before adding block hashes",
            )
        files.append(dataclasses.replace(entry, blocks=blocks))
        added += 1
    if not added:
        return manifest, 0
    return write_manifest(folder, dataclasses.replace(manifest, files=tuple(files), checksum="")), added


def write_manifest(root: str | os.PathLike[str], manifest: Manifest) -> Manifest:
    """Write ``manifest.json`` crash-safely (call it last); returns it with its checksum."""
    payload = manifest.payload()
    payload["checksum"] = checksum = content_checksum(payload)
    atomic_write_bytes(Path(root) / MANIFEST_NAME, _serialise(payload))
    return dataclasses.replace(manifest, checksum=checksum)


def _expect(payload: dict[str, Any], key: str, kinds: tuple[type, ...], path: Path) -> Any:
    if key not in payload:
        raise FormatError(f"manifest has no {key!r}", path=path, field=key)
    value = payload[key]
    if not isinstance(value, kinds) or isinstance(value, bool):
        raise FormatError(
            f"manifest field {key!r} is {type(value).__name__}, expected {'/'.join(k.__name__ for k in kinds)}",
            path=path,
            field=key,
        )
    return value


def check_vocab_and_eos(vocab_size: int | None, eos_id: int | None, *, path: Path, what: str) -> None:
    """A recorded vocab size is >= 1, an EOS id >= 0 and, with both known, below the vocab size (FormatError)."""
    hint = f"The {what} was edited or damaged; restore it, or re-create the dataset with the tokenizer's values"
    if vocab_size is not None and vocab_size < 1:
        raise FormatError(f"{what} records vocab_size {vocab_size}", path=path, field="vocab_size", hint=hint)
    if eos_id is not None and eos_id < 0:
        raise FormatError(f"{what} records eos_id {eos_id}", path=path, field="eos_id", hint=hint)
    if vocab_size is not None and eos_id is not None and eos_id >= vocab_size:
        raise FormatError(
            f"{what} records eos_id {eos_id}, outside its vocab_size {vocab_size}", path=path, field="eos_id", hint=hint
        )


def _plain_entry(item: object) -> FileEntry | None:
    """The FileEntry of a well-formed ``files`` item by four exact type checks, else None (then
    :func:`_file_entry` names the problem). orjson gives exact types; a bool is no int here either.
    A manifest of 1,000 shards has 2,000 items."""
    if type(item) is not dict:
        return None
    name, size, digest, role = item.get("name"), item.get("bytes"), item.get("xxh3_128"), item.get("role")
    if type(name) is str and type(size) is int and type(digest) is str and type(role) is str and len(item) == 4:
        return FileEntry(name, size, digest, role)
    return None


def _file_entry(item: object, record: int, path: Path) -> FileEntry:
    """The FileEntry of one item of the manifest's ``files`` (FormatError naming what is wrong)."""
    if not isinstance(item, dict):
        raise FormatError("manifest file entry is not an object", path=path, record=record, field="files")
    size = _expect(item, "bytes", (int,), path)
    return FileEntry(
        name=_expect(item, "name", (str,), path),
        bytes=size,
        xxh3_128=_expect(item, "xxh3_128", (str,), path),
        role=_expect(item, "role", (str,), path),
        blocks=BlockHashes.from_json(item, size, path=path, record=record),
    )


def read_manifest(root: str | os.PathLike[str]) -> Manifest:
    """Parse and self-check ``root/manifest.json``."""
    path = as_path(root) / MANIFEST_NAME
    if not path.is_file():
        raise MissingFileError(f"no {MANIFEST_NAME}", path=path)
    raw = path.read_bytes()
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise FormatError(f"manifest is not valid JSON ({exc})", path=path) from exc
    if not isinstance(payload, dict):
        raise FormatError("manifest is not a JSON object", path=path)
    version = _expect(payload, "manifest_version", (int,), path)
    if version not in READABLE_MANIFEST_VERSIONS:
        raise FormatError(
            f"manifest version {version}, expected one of {READABLE_MANIFEST_VERSIONS}",
            path=path,
            field="manifest_version",
            hint="Upgrade tokenloom-formats or re-create the dataset",
        )
    recorded = _expect(payload, "checksum", (str,), path)
    actual = content_checksum(payload)
    if actual != recorded:
        raise ChecksumError(
            f"manifest content checksum is {actual}, the manifest records {recorded}",
            path=path,
            field="checksum",
            hint="The manifest was edited or damaged; restore it or re-create the dataset",
        )
    if raw != _serialise(payload):
        raise ChecksumError(
            "manifest bytes differ from the form tokenloom writes, though its content checksum matches "
            "(edited whitespace or appended bytes?)",
            path=path,
            hint="Restore the manifest, or rewrite it with tokenloom.formats.write_manifest",
        )
    files: list[Any] = []
    seen: set[str] = set()
    for i, item in enumerate(_expect(payload, "files", (list,), path)):
        entry = _plain_entry(item)
        files.append(entry if entry is not None else _file_entry(item, i, path))
        name = files[-1].name
        if "\0" in name:  # the OS refuses such a path with a bare ValueError
            raise FormatError(
                f"manifest file name {name!r} contains a NUL byte",
                path=path,
                record=i,
                field="files.name",
                hint="The manifest was edited or damaged; restore it or re-create the dataset",
            )
        if "/" in name or name in ("", ".", "..") or name in seen:
            what = f"the file {name!r} twice" if name in seen else f"a file outside the dataset: {name!r}"
            raise FormatError(f"manifest lists {what}", path=path, record=i, field="files.name")
        seen.add(name)
    optional = {"vocab_size": (int,), "eos_id": (int,), "tokenizer_fingerprint": (str,), "metadata": (dict,)}
    for key, kinds in optional.items():
        value = payload.get(key)
        if value is not None and (not isinstance(value, kinds) or isinstance(value, bool)):
            raise FormatError(f"manifest field {key!r} has type {type(value).__name__}", path=path, field=key)
    check_vocab_and_eos(payload.get("vocab_size"), payload.get("eos_id"), path=path, what="manifest")
    required = {"format": (str,), "dtype": (str,), "num_tokens": (int,), "num_documents": (int,)}
    fields = {key: _expect(payload, key, kinds, path) for key, kinds in required.items()}
    fields |= {key: payload.get(key) for key in optional} | {"metadata": payload.get("metadata", {})}
    return Manifest(**fields, files=tuple(files), checksum=recorded, version=version)
