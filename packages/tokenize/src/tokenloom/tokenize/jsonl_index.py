"""Random access to the lines of a ``.jsonl`` file through a byte-offset index.

The index is an ``(n, 2)`` int64 array of (offset, length) per line (the length
excludes the newline), saved beside the file as ``FILE.jsonl.idx.npy``: a plain
numpy file, loaded with ``allow_pickle=False``. Beside it, ``FILE.jsonl.idx.json``
records the file's size, mtime and an xxh3 of its first and last MiB (of the whole
file with ``full_hash=True``). The index is built on first use when missing, and
rebuilt when it no longer matches the file: size, mtime, either hash, or one of
64 sampled lines whose recorded end is not a newline.

    index = JsonlIndex("data/train.jsonl")     # builds data/train.jsonl.idx.npy if needed
    len(index), index.raw(7), index[7]["text"]
"""

from __future__ import annotations

import codecs
import logging
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import xxhash

from tokenloom.formats import ConfigError, FormatError, IndexCorruptError, MissingFileError, RecordError
from tokenloom.formats.io import atomic_file, atomic_write_bytes
from tokenloom.tokenize.inputs import Cut, sniff

__all__ = ["INDEX_SUFFIX", "RECORD_SUFFIX", "JsonlIndex", "build_index", "index_path"]

log = logging.getLogger("tokenloom.tokenize")

INDEX_SUFFIX = ".idx.npy"
RECORD_SUFFIX = ".idx.json"
_BLOCK = 16 << 20
_EDGE = 1 << 20  # bytes hashed at each end of the file
_SAMPLED_LINES = 64
_SNIFF = 64 << 10  # bytes read to tell a jsonl file from a binary one


def index_path(path: str | os.PathLike[str]) -> Path:
    """Where the index of ``path`` lives: ``path + '.idx.npy'``."""
    path = Path(path)
    return path.with_name(path.name + INDEX_SUFFIX)


def _record_path(path: Path) -> Path:
    return path.with_name(path.name + RECORD_SUFFIX)


def _content_record(path: Path, *, full_hash: bool) -> dict[str, Any]:
    """Size, mtime and hashes that identify the file's content (first and last MiB, or all of it)."""
    info = path.stat()
    record: dict[str, Any] = {"size": info.st_size, "mtime_ns": info.st_mtime_ns}
    with open(path, "rb") as handle:
        record["head_xxh3"] = xxhash.xxh3_64_hexdigest(handle.read(_EDGE))
        handle.seek(max(0, info.st_size - _EDGE))
        record["tail_xxh3"] = xxhash.xxh3_64_hexdigest(handle.read(_EDGE))
        if full_hash:
            digest = xxhash.xxh3_128()
            handle.seek(0)
            while block := handle.read(_BLOCK):
                digest.update(block)
            record["xxh3_128"] = digest.hexdigest()
    return record


def _stale_reason(path: Path, index: npt.NDArray[np.int64]) -> str | None:
    """Why the index no longer describes ``path`` (None: it does)."""
    try:
        recorded = orjson.loads(_record_path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return f"{_record_path(path).name} is missing or unreadable"
    if not isinstance(recorded, dict):
        return f"{_record_path(path).name} is not a JSON object"
    current = _content_record(path, full_hash="xxh3_128" in recorded)
    for key, value in current.items():
        if recorded.get(key) != value:
            return f"the file's {key} changed since the index was built"
    if len(index):
        picks = np.unique(np.linspace(0, len(index) - 1, num=min(_SAMPLED_LINES, len(index))).astype(np.int64))
        ends = index[picks, 0] + index[picks, 1]
        with open(path, "rb") as handle:
            for end in ends.tolist():
                if end >= current["size"]:
                    continue  # the last line may lack its newline
                handle.seek(end)
                if handle.read(1) != b"\n":
                    return f"a recorded line end at byte {end} is not a newline"
    return None


def _check_input(path: Path) -> None:
    """Only a plain line input has byte offsets (a compressed stream or a row file does not). Its kind is the input
    room's: magic bytes first, the suffix cross-checked (a FormatError when they disagree)."""
    if not path.is_file():
        raise MissingFileError("no such jsonl file", path=path)
    kind = sniff(path)
    if kind.cut is not Cut.BYTES:
        raise ConfigError(
            f"a {kind.name} file has no byte offsets to index",
            path=path,
            hint="Decompress or convert it to a plain .jsonl first (e.g. gunzip -k FILE.jsonl.gz) and index that",
        )


def _check_text(path: Path) -> None:
    """Refuse a file that is not text jsonl: NUL bytes or invalid UTF-8 in its first 64 KiB, or a first
    line that is not a JSON object (FormatError naming the file and the byte)."""
    with open(path, "rb") as handle:
        head = handle.read(_SNIFF)
        complete = len(head) < _SNIFF
    hint = "`tokenloom index` takes a jsonl file: UTF-8 text, one JSON object per line"
    nul = head.find(b"\0")
    if nul >= 0:
        raise FormatError("a NUL byte: this is a binary file, not jsonl", path=path, offset=nul, hint=hint)
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=complete)
    except UnicodeDecodeError as exc:
        raise FormatError(
            f"invalid UTF-8 ({exc.reason}): this is not a jsonl text file", path=path, offset=exc.start, hint=hint
        ) from None
    start = len(head) - len(head.lstrip())  # blank lines before the first record are allowed
    end = head.find(b"\n", start)
    if end < 0 and not complete:
        return  # a first line longer than the sniffed block: checked when it is read
    first = head[start : end if end >= 0 else len(head)]
    if not first.strip():
        return  # an empty or blank file: no lines to index
    line = head[:start].count(b"\n") + 1
    try:
        record = orjson.loads(first)
    except orjson.JSONDecodeError as exc:
        raise FormatError(
            f"the first line is not JSON ({exc})", path=path, offset=start, record=line, hint=hint
        ) from None
    if not isinstance(record, dict):
        raise FormatError(
            f"the first line is a JSON {type(record).__name__}, expected an object",
            path=path,
            offset=start,
            record=line,
            hint=hint,
        )


def build_index(path: str | os.PathLike[str], *, full_hash: bool = False) -> npt.NDArray[np.int64]:
    """Scan ``path`` for newlines and write its index crash-safely; returns the (n, 2) array.

    ``full_hash``: record an xxh3 of the whole file (checked on every open) instead of only its ends.
    """
    path = Path(path)
    _check_input(path)
    _check_text(path)
    record = _content_record(path, full_hash=full_hash)
    newline_positions = []
    size = 0
    with open(path, "rb") as handle:
        while block := handle.read(_BLOCK):
            found = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == ord("\n"))
            newline_positions.append(found.astype(np.int64) + size)
            size += len(block)
    ends = np.concatenate(newline_positions) if newline_positions else np.zeros(0, np.int64)
    if size and (len(ends) == 0 or ends[-1] != size - 1):
        ends = np.append(ends, size)  # a last line without its newline
    starts = np.zeros(len(ends), dtype=np.int64)
    starts[1:] = ends[:-1] + 1
    index = np.stack([starts, ends - starts], axis=1).astype(np.int64)
    with atomic_file(index_path(path)) as handle:
        np.save(handle, index, allow_pickle=False)
    atomic_write_bytes(_record_path(path), orjson.dumps(record, option=orjson.OPT_SORT_KEYS))
    return index


def _load(path: Path) -> npt.NDArray[np.int64] | None:
    """The stored index of ``path`` if it is present and current, else None."""
    idx = index_path(path)
    if not idx.is_file() or idx.stat().st_mtime_ns < path.stat().st_mtime_ns:
        return None
    try:
        index = np.load(idx, allow_pickle=False)
    except Exception as exc:  # a damaged cache of our own (numpy's header parser raises many types): rebuild it
        log.warning("rebuilding the unreadable index %s (%s: %s)", idx, type(exc).__name__, exc)
        return None
    if index.ndim != 2 or index.shape[1] != 2 or index.dtype != np.int64:
        raise IndexCorruptError(
            f"index has shape {index.shape} and dtype {index.dtype}, expected (n, 2) int64",
            path=idx,
            hint=f"Delete it; it is rebuilt from {path.name} on next use",
        )
    if len(index) and (int(index.min()) < 0 or (np.diff(index[:, 0]) <= 0).any()):
        log.warning("rebuilding the index %s: its offsets are negative or not increasing", idx)
        return None
    size = path.stat().st_size
    covered = int(index[-1, 0] + index[-1, 1]) if len(index) else 0
    if covered not in (size, size - 1):
        log.warning("rebuilding the index %s: it covers %d bytes, the file has %d", idx, covered, size)
        return None
    reason = _stale_reason(path, index)
    if reason is not None:
        log.warning("rebuilding the index %s: %s", idx, reason)
        return None
    return index


class JsonlIndex:
    """Line ``i`` of a jsonl file by number, via a memory map and the byte-offset index."""

    def __init__(self, path: str | os.PathLike[str], *, create: bool = True) -> None:
        self.path = Path(path)
        _check_input(self.path)
        index = _load(self.path)
        if index is None:
            if not create:
                raise MissingFileError(
                    "the jsonl file has no current index",
                    path=index_path(self.path),
                    hint=f"Run `tokenloom index {self.path}`",
                )
            index = build_index(self.path)
        self.offsets: npt.NDArray[np.int64] = index
        self._map: mmap.mmap | None = None

    def __len__(self) -> int:
        return len(self.offsets)

    def _mapped(self) -> mmap.mmap | bytes:
        if self._map is None:
            if self.path.stat().st_size == 0:
                return b""
            with open(self.path, "rb") as handle:
                self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        return self._map

    def raw(self, i: int) -> bytes:
        """Line ``i`` as bytes, without its newline."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"line {i} out of range for {len(self)} lines in {self.path}")
        offset, length = (int(x) for x in self.offsets[i])
        line = self._mapped()[offset : offset + length]
        return line[:-1] if line.endswith(b"\r") else line

    def __getitem__(self, i: int) -> Any:
        """Line ``i`` parsed as JSON."""
        try:
            return orjson.loads(self.raw(i))
        except orjson.JSONDecodeError as exc:
            raise RecordError(
                f"line is not valid JSON ({exc})", path=self.path, record=i + 1 if i >= 0 else len(self) + i + 1
            ) from exc

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None

    def __getstate__(self) -> dict[str, Any]:  # a DataLoader worker maps the file itself
        return {"path": self.path, "offsets": self.offsets, "_map": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        self.offsets = state["offsets"]
        self._map = None
