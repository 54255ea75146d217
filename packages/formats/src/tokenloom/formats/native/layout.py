"""GPT-Simple's ``.idx`` byte layout: the 16-byte header and its dtype codes.

This is the layout ``gpt_simple/pretokenize.py`` (``write_idx`` / ``read_idx``,
gpt-simple-lm 0.1.2) writes and reads; all integers little-endian::

    offset     size            field
    0          4               magic b"GPTS"
    4          4   uint32      version (1)
    8          4   uint32      dtype code (2 uint16, 4 uint32; tokenloom extensions below)
    12         4   uint32      entry count n
    16         8*(n+1) int64   token offsets: 0, end of entry 0, ..., total token count
    16+8(n+1)  2*n uint16      overlap-prefix length of each entry

Codes 2 and 4 are GPT-Simple's. tokenloom also stores uint8, int32 and int64
under codes GPT-Simple never writes (``EXTENSION_CODES``); GPT-Simple does not
check the code (its ``PreTokenizedDataset`` reads every code other than 2 as
uint32), so only write those when GPT-Simple will not read the data.

tokenloom's pre-release native layout (``<4sHHQ``: uint16 version, uint16 dtype
code from its own table, uint64 count) has the same size and arrays; it is
recognised and refused with the command that converts it.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from tokenloom.formats.errors import FormatError, IndexCorruptError, TruncatedError
from tokenloom.formats.io.dtypes import as_token_dtype
from tokenloom.formats.io.scan import check_exact_size

__all__ = [
    "CODE_OF_DTYPE",
    "DTYPE_CODES",
    "EXTENSION_CODES",
    "GPT_SIMPLE_CODES",
    "HEADER",
    "LEGACY_CONVERT_HINT",
    "MAX_ENTRIES",
    "NATIVE_MAGIC",
    "NATIVE_VERSION",
    "entry_count",
    "idx_size",
    "pack_header",
    "parse_header",
]

NATIVE_MAGIC = b"GPTS"
NATIVE_VERSION = 1
HEADER = struct.Struct("<4sIII")
MAX_ENTRIES = (1 << 32) - 1  # the count is a uint32
GPT_SIMPLE_CODES = {2: "uint16", 4: "uint32"}
EXTENSION_CODES = {0x101: "uint8", 0x104: "int32", 0x108: "int64"}  # tokenloom only: 0x100 + item size
#: manifest metadata key: the largest overlap prefix of any entry, recorded by the native writer
MAX_OVERLAP_KEY = "max_overlap_prefix"


def no_overlaps_recorded(metadata: object) -> bool:
    """True when a native manifest's metadata says every overlap prefix is 0.

    The native writer records :data:`MAX_OVERLAP_KEY`; a tokenize run records its ``overlap_size``. A reader
    of a remote copy can then serve the overlap prefixes without fetching each shard's ``.idx``.
    """
    if not isinstance(metadata, dict):
        return False
    if metadata.get(MAX_OVERLAP_KEY) == 0:
        return True
    recorded = metadata.get("tokenize")
    settings = recorded.get("settings") if isinstance(recorded, dict) else None
    return isinstance(settings, dict) and settings.get("overlap_size") == 0


DTYPE_CODES = {**GPT_SIMPLE_CODES, **EXTENSION_CODES}
CODE_OF_DTYPE = {name: code for code, name in DTYPE_CODES.items()}

_LEGACY_HEADER = struct.Struct("<4sHHQ")
_LEGACY_CODES = {1: "uint8", 2: "uint16", 3: "uint32", 4: "int32", 5: "int64"}
LEGACY_CONVERT_HINT = (
    "Convert it once: tokenloom convert OLD_DIR NEW_DIR --to native --from native-v0 "
    "(or re-create it with the current tokenloom)"
)


def idx_size(count: int) -> int:
    """Bytes of an ``.idx`` holding ``count`` entries."""
    return HEADER.size + 8 * (count + 1) + 2 * count


def entry_count(size: int, *, path: Path | str) -> int:
    """The entry count of an ``.idx`` of ``size`` bytes (IndexCorruptError when no count gives that size)."""
    count, rest = divmod(size - HEADER.size - 8, 10)
    if rest or count < 0:
        raise IndexCorruptError(
            f"{size} bytes is not the size of any GPT-Simple index (16 + 10 * entries + 8)",
            path=path,
            field="count",
            hint=f"{path} is damaged or not a native index: restore it or re-create the dataset",
        )
    return count


def pack_header(dtype: np.dtype, count: int) -> bytes:
    return HEADER.pack(NATIVE_MAGIC, NATIVE_VERSION, CODE_OF_DTYPE[dtype.name], count)


def _looks_legacy(head: bytes, file_size: int) -> bool:
    _, version, code, count = _LEGACY_HEADER.unpack_from(head)
    return version == 1 and code in _LEGACY_CODES and count < (1 << 40) and file_size == idx_size(count)


def parse_header(head: bytes, *, path: Path | str, file_size: int) -> tuple[np.dtype, int]:
    """(dtype, entry count) of an ``.idx`` whose first bytes are ``head``, after every header check.

    ``file_size`` is the ``.idx``'s size on disk: the count must announce exactly that
    many bytes, checked before the index is read (the count field is untrusted).
    """
    if len(head) < HEADER.size:
        raise TruncatedError(
            f"index has {file_size} bytes, shorter than its {HEADER.size}-byte header", path=path, offset=0
        )
    magic, version, code, count = HEADER.unpack_from(head)
    if magic != NATIVE_MAGIC:
        raise FormatError(f"magic {magic!r}, expected {NATIVE_MAGIC!r}", path=path, offset=0, field="magic")
    if version != NATIVE_VERSION:
        if _looks_legacy(head, file_size):
            raise FormatError(
                "this .idx is in tokenloom's pre-release native layout (uint16 version, uint16 dtype code, "
                "uint64 count), not GPT-Simple's <4sIII header",
                path=path,
                offset=4,
                field="version",
                hint=LEGACY_CONVERT_HINT,
            )
        raise FormatError(
            f"version {version}, expected {NATIVE_VERSION} (GPT-Simple .idx version 1)",
            path=path,
            offset=4,
            field="version",
            hint="Re-create the shards with GPT-Simple's pretokenize or `tokenloom tokenize`",
        )
    if code not in DTYPE_CODES:
        raise FormatError(
            f"dtype code {code}, expected 2 (uint16) or 4 (uint32) (GPT-Simple's), or a tokenloom extension "
            f"code ({', '.join(f'{c:#x} {n}' for c, n in EXTENSION_CODES.items())})",
            path=path,
            offset=8,
            field="dtype",
        )
    return sized_header(DTYPE_CODES[code], count, path=path, file_size=file_size, count_offset=12)


def parse_legacy_header(head: bytes, *, path: Path, file_size: int) -> tuple[np.dtype, int]:
    """(dtype, count) of an ``.idx`` in tokenloom's pre-release layout (for ``--from native-v0``)."""
    if len(head) < _LEGACY_HEADER.size:
        raise TruncatedError(f"index has {file_size} bytes, shorter than its 16-byte header", path=path, offset=0)
    magic, version, code, count = _LEGACY_HEADER.unpack_from(head)
    if magic != NATIVE_MAGIC or version != 1 or code not in _LEGACY_CODES:
        raise FormatError(
            f"not a pre-release tokenloom .idx (magic {magic!r}, uint16 version {version}, uint16 code {code})",
            path=path,
            offset=0,
            hint="Open it as format 'native' (GPT-Simple's layout)",
        )
    return sized_header(_LEGACY_CODES[code], count, path=path, file_size=file_size, count_offset=8)


def sized_header(
    dtype_name: str, count: int, *, path: Path | str, file_size: int, count_offset: int
) -> tuple[np.dtype, int]:
    """(dtype, count), once the ``.idx`` is exactly the size ``count`` entries need (else a named error)."""
    expected = idx_size(count)
    problem = f"entry count {count} implies an index of {expected} bytes, the file has {file_size}"
    check_exact_size(file_size, expected, problem, path=path, offset=count_offset, field="count")
    return as_token_dtype(dtype_name), count
