"""The ``.npy`` header, parsed without ``np.load`` and written with a fixed size.

Reading: the magic, version and header length are checked, the header (at most
``MAX_HEADER_BYTES``, numpy's own default cap) is evaluated with
``ast.literal_eval`` only, and the array must be 1-D, C order, little-endian and
of a token dtype. ``prod(shape) * itemsize`` must equal the payload size, which
is checked from the file size before anything is mapped or allocated. Object
dtypes (stored as pickles) are refused before a byte of data is read.

Writing: a 128-byte version-1.0 header whose shape field is rewritten in place
when the array's final length is known, so a shard can be streamed to disk.
"""

from __future__ import annotations

import ast
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenloom.formats.errors import FormatError, ResourceLimitError, TruncatedError, UnsafeFormatError
from tokenloom.formats.io.dtypes import TOKEN_DTYPES
from tokenloom.formats.io.scan import check_exact_size
from tokenloom.formats.io.source import current_source

__all__ = ["MAX_HEADER_BYTES", "NPY_HEADER_SIZE", "NPY_MAGIC", "NpyHeader", "npy_header", "read_npy_header"]

NPY_MAGIC = b"\x93NUMPY"
MAX_HEADER_BYTES = 10_000
NPY_HEADER_SIZE = 128  # what npy_header writes: a multiple of 64, room for a 20-digit shape
_KEYS = {"descr", "fortran_order", "shape"}
_LITERAL_ERRORS = (ValueError, SyntaxError, TypeError, MemoryError, RecursionError)


@dataclass(frozen=True, slots=True)
class NpyHeader:
    """What a validated ``.npy`` header says: ``count`` tokens of ``dtype`` from byte ``data_offset``."""

    dtype: np.dtype
    count: int
    data_offset: int


def read_npy_header(path: Path, *, file_size: int, max_header_bytes: int = MAX_HEADER_BYTES) -> NpyHeader:
    """Validate the header of the 1-D token array in ``path`` (``file_size`` bytes long)."""
    with current_source().open(path) as handle:
        prefix = handle.read(12)
        if len(prefix) < 10:
            raise TruncatedError(f"file has {len(prefix)} bytes, shorter than a .npy preamble", path=path)
        if prefix[:6] != NPY_MAGIC:
            raise FormatError(f"magic {prefix[:6]!r}, expected {NPY_MAGIC!r}", path=path, offset=0, field="magic")
        major, minor = prefix[6], prefix[7]
        if major == 1:
            (header_len,), start = struct.unpack_from("<H", prefix, 8), 10
        elif major in (2, 3):
            if len(prefix) < 12:
                raise TruncatedError("file ends inside the .npy preamble", path=path, offset=8, field="header_len")
            (header_len,), start = struct.unpack_from("<I", prefix, 8), 12
        else:
            raise FormatError(
                f".npy version {major}.{minor}, expected 1.0, 2.0 or 3.0", path=path, offset=6, field="version"
            )
        if header_len > max_header_bytes:
            raise ResourceLimitError(
                f".npy header of {header_len} bytes, more than the {max_header_bytes}-byte cap",
                path=path,
                offset=8,
                field="header_len",
            )
        if start + header_len > file_size:
            raise TruncatedError(
                f".npy header of {header_len} bytes runs past the end of the {file_size}-byte file",
                path=path,
                offset=8,
                field="header_len",
            )
        handle.seek(start)
        raw = handle.read(header_len)
    try:
        text = raw.decode("utf-8" if major == 3 else "latin-1")
        header = ast.literal_eval(text)
    except (*_LITERAL_ERRORS, UnicodeDecodeError) as exc:
        raise FormatError(
            f".npy header is not a Python literal ({type(exc).__name__})", path=path, offset=start, field="header"
        ) from None
    if not isinstance(header, dict) or set(header) != _KEYS:
        keys = sorted(map(str, header)) if isinstance(header, dict) else type(header).__name__
        raise FormatError(f".npy header holds {keys}, expected the keys {sorted(_KEYS)}", path=path, offset=start)
    dtype = _token_dtype(header["descr"], path=path, offset=start)
    if header["fortran_order"] is not False:
        raise FormatError(
            f"fortran_order is {header['fortran_order']!r}, expected False",
            path=path,
            offset=start,
            field="fortran_order",
            hint="Save the shard with np.save(path, np.ascontiguousarray(tokens))",
        )
    shape = header["shape"]
    if not isinstance(shape, tuple) or not all(isinstance(n, int) and not isinstance(n, bool) for n in shape):
        raise FormatError(f"shape is {shape!r}, expected a tuple of ints", path=path, offset=start, field="shape")
    if len(shape) != 1:
        raise FormatError(
            f"array is {len(shape)}-D with shape {shape}, expected a 1-D token array",
            path=path,
            offset=start,
            field="shape",
            hint="Flatten the array (tokens.reshape(-1)) and save it again",
        )
    count = shape[0]
    if count < 0:
        raise FormatError(f"shape {shape} is negative", path=path, offset=start, field="shape")
    data_offset = start + header_len
    payload = file_size - data_offset
    expected = count * dtype.itemsize
    problem = f"shape {shape} of {dtype.name} needs {expected} data bytes, the file has {payload}"
    check_exact_size(payload, expected, problem, larger=FormatError, path=path, offset=data_offset, field="shape")
    return NpyHeader(dtype=dtype, count=count, data_offset=data_offset)


def _token_dtype(descr: object, *, path: Path, offset: int) -> np.dtype:
    if not isinstance(descr, str):
        raise FormatError(
            f"descr is {descr!r}, expected a plain dtype string (structured arrays are not token shards)",
            path=path,
            offset=offset,
            field="descr",
        )
    try:
        dtype = np.dtype(descr)
    except (TypeError, ValueError, SyntaxError):  # numpy raises SyntaxError for some strings, e.g. ",u2"
        raise FormatError(f"descr {descr!r} is not a numpy dtype", path=path, offset=offset, field="descr") from None
    if dtype.hasobject:
        raise UnsafeFormatError(
            f"descr {descr!r} is an object dtype, stored as a pickle",
            path=path,
            offset=offset,
            field="descr",
        )
    big_endian = dtype.byteorder == ">" or (dtype.byteorder == "=" and sys.byteorder == "big")
    if big_endian:
        raise FormatError(
            f"descr {descr!r} is big-endian, expected little-endian",
            path=path,
            offset=offset,
            field="descr",
            hint="Save with tokens.astype(tokens.dtype.newbyteorder('<'))",
        )
    if dtype.name not in TOKEN_DTYPES:
        raise FormatError(
            f"descr {descr!r} ({dtype.name}) cannot hold token ids, expected one of {sorted(TOKEN_DTYPES)}",
            path=path,
            offset=offset,
            field="descr",
        )
    return TOKEN_DTYPES[dtype.name]


def npy_header(dtype: np.dtype, count: int) -> bytes:
    """A ``NPY_HEADER_SIZE``-byte version-1.0 header for ``count`` items of ``dtype``."""
    body = f"{{'descr': '{dtype.str}', 'fortran_order': False, 'shape': ({count},), }}"
    length = NPY_HEADER_SIZE - 10
    text = body.ljust(length - 1) + "\n"
    if len(text) != length:  # only a shape beyond 40 digits could get here
        raise ValueError(f"shape {count} does not fit a {NPY_HEADER_SIZE}-byte header")
    return NPY_MAGIC + b"\x01\x00" + struct.pack("<H", length) + text.encode("latin-1")
