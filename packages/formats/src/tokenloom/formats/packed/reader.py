"""The packed format: Modalities ``.pbin`` files, in both of their layouts.

A ``.pbin`` file is one header, the data section (every document's tokens,
concatenated) and a pickled index ``[(byte_start, byte_length), ...]``, one pair
per document, that runs to the end of the file (all little-endian)::

    current layout (Modalities >= 0.2)        legacy layout (the seed's)
    0   8  uint64  data length D in bytes     0   8  uint64  data length D in bytes
    8   4  uint32  token size T (1, 2 or 4)   8   D  uint32  tokens
    12  D  uintT   tokens                     8+D    pickled index
    12+D   pickled index

Byte starts count from the start of the data section (as Modalities writes them
since mid-2024); files whose starts count from the start of the file (older
writers) are recognised too. The layout is never guessed: a layout fits when its
header, the data length, the token size and the index all add up (the index
parses, its entries are token-aligned, cover the data in order without gaps or
overlaps and end exactly at D). If both layouts fit, or neither, that is a
FormatError; ``layout=`` picks one explicitly. The index is read by
:mod:`tokenloom.formats.packed.pickle_safe`, never by ``pickle.loads``.

A ``.pbin`` has no field for the EOS id, vocab size or tokenizer: tokenloom keeps
them in ``NAME.pbin.tokenloom.json`` beside the file (see
:mod:`tokenloom.formats.io.sidecar`), which Modalities ignores.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from tokenloom.formats._contract import Validate
from tokenloom.formats._dataset import Shard, TokenDataset, sidecar_values
from tokenloom.formats.errors import (
    ConfigError,
    DataError,
    FormatError,
    IndexCorruptError,
    MissingFileError,
    ResourceLimitError,
    TruncatedError,
    UnsafeFormatError,
)
from tokenloom.formats.io.dtypes import TOKEN_DTYPES, check_asked_dtype
from tokenloom.formats.io.index_map import cached_index, derived_index, zeros_index
from tokenloom.formats.io.paths import as_path, names_in, safe_file
from tokenloom.formats.io.source import current_source
from tokenloom.formats.packed.pickle_safe import load_int_tuples

__all__ = ["PACKED_LAYOUTS", "PACKED_SUFFIX", "PackedFile", "is_packed", "open_packed", "read_packed_file"]

PACKED_SUFFIX = ".pbin"
PACKED_LAYOUTS = ("current", "legacy")
#: Refuse pickled indexes larger than this unless asked (a length field asking for more than a cap).
DEFAULT_MAX_INDEX_BYTES = 1 << 30
_HEADER_SIZE = {"current": 12, "legacy": 8}
_TOKEN_DTYPES = {1: TOKEN_DTYPES["uint8"], 2: TOKEN_DTYPES["uint16"], 4: TOKEN_DTYPES["uint32"]}


@dataclass(frozen=True, slots=True)
class PackedFile:
    """One validated .pbin file: its layout and the shard over its data section."""

    layout: str
    token_size: int
    index_base: int  # 0: starts count from the data section; header size: from the file start
    shard: Shard


class _Attempt:
    """How far reading one layout got, to pick the most telling error when neither fits."""

    def __init__(self) -> None:
        self.index_parsed = False


def read_packed_file(
    path: Path,
    root: Path,
    *,
    layout: str | None = None,
    max_index_bytes: int = DEFAULT_MAX_INDEX_BYTES,
    max_entries: int | None = None,
    rederive: bool = False,
) -> PackedFile:
    """Validate one .pbin file (header, sizes, the whole index) and return its shard.

    The pickled index has to be parsed (in RAM) once per version of the file: the token offsets it
    gives are then kept in the index cache (:func:`~tokenloom.formats.io.index_map.derived_index`,
    keyed by the file's path, inode, size and timestamps) and later opens memory-map them without
    parsing; ``rederive`` parses and checks again.
    """
    if layout is not None and layout not in PACKED_LAYOUTS:
        raise ConfigError(f"layout={layout!r}, expected one of {list(PACKED_LAYOUTS)}", field="layout")
    safe_file(root, path)
    size = path.stat().st_size
    with current_source().open(path) as handle:
        head = handle.read(12)
        if len(head) < 8:
            raise TruncatedError(
                f"file has {size} bytes, shorter than the 8-byte data-length header", path=path, field="data_length"
            )
        (data_len,) = struct.unpack_from("<Q", head)
        if 8 + data_len > size:
            raise TruncatedError(
                f"the header announces {data_len} data bytes, the file holds {size - 8} after the 8-byte header",
                path=path,
                offset=0,
                field="data_length",
            )
        candidates = [layout] if layout is not None else list(PACKED_LAYOUTS)
        if not rederive:
            cached = _cached_file(path, head, data_len, candidates, explicit=layout is not None)
            if cached is not None:
                return cached
        found: dict[str, PackedFile] = {}
        errors: dict[str, DataError] = {}
        attempts: dict[str, _Attempt] = {}
        for name in candidates:
            attempts[name] = _Attempt()
            try:
                found[name] = _read_layout(
                    handle, path, name, head, data_len, size, max_index_bytes, max_entries, attempts[name]
                )
            except DataError as exc:
                errors[name] = exc
    if len(found) == 1:
        return _publish(next(iter(found.values())), explicit=layout is not None)
    if len(found) > 1:
        raise FormatError(
            "the file is consistent with both the current and the legacy .pbin layout",
            path=path,
            hint="Pass layout='current' or layout='legacy' to choose",
        )
    if layout is not None:
        raise errors[layout]
    parsed = [name for name in candidates if attempts[name].index_parsed]
    if len(parsed) == 1:
        raise errors[parsed[0]]
    for error in errors.values():
        if isinstance(error, UnsafeFormatError):
            raise error
    reasons = "; ".join(f"{name} layout: {errors[name].problem}" for name in candidates)
    raise FormatError(
        f"neither .pbin layout fits ({reasons})",
        path=path,
        hint="The file is damaged or not a Modalities .pbin; pass layout=... to see that layout's checks in detail",
    )


def _cache_what(layout: str, base: int, *, explicit: bool) -> str:
    return f"pbin token offsets layout={layout} base={base} explicit={explicit}"


def _publish(found: PackedFile, *, explicit: bool) -> PackedFile:
    """``found`` with its offsets moved to the index cache (mapped: the parsed arrays are freed)."""
    shard = found.shard
    offsets = shard.offsets
    what = _cache_what(found.layout, found.index_base, explicit=explicit)
    shard.offsets = derived_index([shard.tokens_path], what, len(offsets), lambda: [offsets], rebuild=True)
    return found


def _cached_file(
    path: Path, head: bytes, data_len: int, candidates: Sequence[str], *, explicit: bool
) -> PackedFile | None:
    """The PackedFile a previous open derived for this version of ``path`` (its header re-checked), or None."""
    for name in candidates:
        header_size = _HEADER_SIZE[name]
        token_size = struct.unpack_from("<I", head, 8)[0] if name == "current" and len(head) >= 12 else 4
        if token_size not in _TOKEN_DTYPES or data_len % token_size:
            continue
        for base in (0, header_size):
            offsets = cached_index([path], _cache_what(name, base, explicit=explicit))
            if offsets is None or len(offsets) == 0 or int(offsets[-1]) != data_len // token_size:
                continue
            return _packed_file(path, name, token_size, base, offsets)
    return None


def _packed_file(path: Path, layout: str, token_size: int, base: int, offsets: np.ndarray) -> PackedFile:
    """The PackedFile of ``path`` whose entries start at ``offsets`` (in tokens; the last: the token count)."""
    shard = Shard(
        tokens_path=path,
        dtype=_TOKEN_DTYPES[token_size],
        num_tokens=int(offsets[-1]),
        offsets=offsets,
        overlap_prefix=zeros_index(len(offsets) - 1),
        tokens_offset=_HEADER_SIZE[layout],
        name=path.name,
    )
    return PackedFile(layout=layout, token_size=token_size, index_base=base, shard=shard)


def _read_layout(
    handle: BinaryIO,
    path: Path,
    layout: str,
    head: bytes,
    data_len: int,
    size: int,
    max_index_bytes: int,
    max_entries: int | None,
    attempt: _Attempt,
) -> PackedFile:
    header_size = _HEADER_SIZE[layout]
    if layout == "current":
        if len(head) < 12:
            raise TruncatedError(
                f"file has {size} bytes, shorter than the 12-byte header", path=path, field="token_size"
            )
        (token_size,) = struct.unpack_from("<I", head, 8)
        if token_size not in _TOKEN_DTYPES:
            raise FormatError(f"token size {token_size}, expected 1, 2 or 4", path=path, offset=8, field="token_size")
    else:
        token_size = 4
    index_start = header_size + data_len
    if index_start >= size:
        raise TruncatedError(
            f"the file ends at byte {size}, before the index that should follow the data at byte {index_start}",
            path=path,
            offset=0,
            field="data_length",
        )
    if data_len % token_size:
        raise FormatError(
            f"data length {data_len} is not a multiple of the token size {token_size}",
            path=path,
            offset=0,
            field="data_length",
        )
    index_len = size - index_start
    if index_len > max_index_bytes:
        raise ResourceLimitError(
            f"the pickled index takes {index_len} bytes, more than the cap of {max_index_bytes}",
            path=path,
            offset=index_start,
            field="index",
            hint="If the file is genuine, pass a larger max_index_bytes",
        )
    handle.seek(index_start)
    raw = handle.read(index_len)
    entries = load_int_tuples(raw, path=path, base_offset=index_start, max_items=max_entries)
    attempt.index_parsed = True
    starts, lengths = _entry_arrays(entries, path=path, index_start=index_start, limit=header_size + data_len)
    base = _index_base(starts, lengths, data_len, header_size, path=path, index_start=index_start)
    _check_entries(starts - base, lengths, data_len, token_size, path=path, index_start=index_start)
    offsets = np.empty(len(starts) + 1, dtype=np.int64)
    offsets[:-1] = (starts - base) // token_size
    offsets[-1] = data_len // token_size
    return _packed_file(path, layout, token_size, base, offsets)


def _entry_arrays(
    entries: list[tuple[int, ...]], *, path: Path, index_start: int, limit: int
) -> tuple[np.ndarray, np.ndarray]:
    """(starts, lengths) as int64, or IndexCorruptError at the first entry that is not a pair in range."""
    for record, entry in enumerate(entries):
        if len(entry) != 2 or not (0 <= entry[0] <= limit and 0 <= entry[1] <= limit):
            raise IndexCorruptError(
                f"index entry {entry!r:.60} is not a (byte start, byte length) pair within the file's {limit} bytes",
                path=path,
                offset=index_start,
                record=record,
                field="index",
            )
    pairs = np.array(entries, dtype=np.int64).reshape(-1, 2)
    return pairs[:, 0], pairs[:, 1]


def _index_base(
    starts: np.ndarray, lengths: np.ndarray, data_len: int, header_size: int, *, path: Path, index_start: int
) -> int:
    """0 when the index ends exactly at the data length, the header size when it counts from the file start."""
    if len(starts) == 0:
        if data_len:
            raise IndexCorruptError(
                f"the index is empty but the data section holds {data_len} bytes",
                path=path,
                offset=index_start,
                field="index",
            )
        return 0
    end = int(starts[-1] + lengths[-1])
    if end == data_len:
        return 0
    if end == header_size + data_len and int(starts[0]) >= header_size:
        return header_size
    raise IndexCorruptError(
        f"the last index entry ends at byte {end}, expected the data length {data_len}",
        path=path,
        offset=index_start,
        record=len(starts) - 1,
        field="index",
    )


def _check_entries(
    starts: np.ndarray, lengths: np.ndarray, data_len: int, token_size: int, *, path: Path, index_start: int
) -> None:
    """Entries are in range, token-aligned, in order, without overlaps or gaps."""
    if len(starts) == 0:
        return
    ends = starts + lengths

    def fail(problem: str, record: int) -> None:
        raise IndexCorruptError(problem, path=path, offset=index_start, record=record, field="index")

    bad = np.flatnonzero((starts < 0) | (ends > data_len))
    if len(bad):
        i = int(bad[0])
        fail(f"entry ({int(starts[i])}, {int(lengths[i])}) reaches outside the {data_len}-byte data section", i)
    bad = np.flatnonzero((starts % token_size != 0) | (lengths % token_size != 0))
    if len(bad):
        i = int(bad[0])
        fail(f"entry ({int(starts[i])}, {int(lengths[i])}) is not aligned to the token size {token_size}", i)
    if int(starts[0]) != 0:
        fail(f"the first entry starts at data byte {int(starts[0])}, expected 0 (bytes before it are unindexed)", 0)
    step = starts[1:] - ends[:-1]
    bad = np.flatnonzero(step != 0)
    if len(bad):
        i = int(bad[0])
        if step[i] < 0:
            fail(f"entries {i} and {i + 1} overlap (entry {i} ends at {int(ends[i])}, {i + 1} starts earlier)", i + 1)
        fail(
            f"bytes {int(ends[i])} to {int(starts[i + 1])} between entries {i} and {i + 1} are in no entry; "
            "tokenloom reads .pbin files whose index covers the data in order",
            i + 1,
        )


def is_packed(path: Path) -> bool:
    """A ``.pbin`` file, or a directory of them (and no native/Megatron index files)."""
    if path.is_file():
        return path.suffix == PACKED_SUFFIX
    if path.is_dir():
        names = names_in(path)
        return any(name.endswith(PACKED_SUFFIX) for name in names) and not any(name.endswith(".idx") for name in names)
    return False


def open_packed(
    path: str | os.PathLike[str],
    *,
    validate: Validate = Validate.FAST,
    dtype: Any = None,
    layout: str | None = None,
    eos_id: int | None = None,
    vocab_size: int | None = None,
    max_index_bytes: int = DEFAULT_MAX_INDEX_BYTES,
    max_entries: int | None = None,
) -> TokenDataset:
    """Open a .pbin file or a directory of them (one shard per file, sorted by name).

    The index is read and checked completely at the first open of each version of a file (it is
    the only way to find the documents); later opens map the offsets it gave from the index cache.
    A .pbin records no vocab size or EOS id: they come from tokenloom's sidecar
    ``NAME.pbin.tokenloom.json`` when a tokenloom writer left one, or from these arguments
    (which must agree with a sidecar).
    ``validate="deep"`` checks token ids and EOS placement against them.
    """
    target = as_path(path)
    if target.is_dir():
        root = target
        files = sorted(target.glob(f"*{PACKED_SUFFIX}"))
        if not files:
            raise FormatError(f"no {PACKED_SUFFIX} files in the directory", path=target)
    elif target.exists() or target.is_symlink():
        root, files = target.parent, [target]
    else:
        raise MissingFileError(f"{target.name} does not exist", path=target)
    packed = [
        read_packed_file(
            f,
            root,
            layout=layout,
            max_index_bytes=max_index_bytes,
            max_entries=max_entries,
            rederive=validate == Validate.DEEP,
        )
        for f in files
    ]
    vocab_size, eos_id, tokenizer_fingerprint = sidecar_values(
        [(f, f) for f in files], root, vocab_size=vocab_size, eos_id=eos_id, what="files"
    )
    for item in packed:
        recorded = f"the file stores {item.token_size}-byte tokens of"
        check_asked_dtype(dtype, item.shard.dtype, recorded=recorded, path=item.shard.tokens_path)
    dataset = TokenDataset(
        [item.shard for item in packed],
        format="packed",
        root=target,
        eos_id=eos_id,
        vocab_size=vocab_size,
        tokenizer_fingerprint=tokenizer_fingerprint,
        metadata={"layouts": {item.shard.name: item.layout for item in packed}},
    )
    return dataset.check_deep(validate)
