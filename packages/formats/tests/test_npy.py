"""The .npy header parser: what it accepts, and a named error for everything else."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from tokenloom.formats import FormatError, ResourceLimitError, TruncatedError, UnsafeFormatError
from tokenloom.formats.flat.npy import NPY_HEADER_SIZE, npy_header, read_npy_header


def header_file(path: Path, header: str, payload: bytes = b"", *, version: int = 1) -> Path:
    raw = header.encode("latin-1")
    length = struct.pack("<H", len(raw)) if version == 1 else struct.pack("<I", len(raw))
    path.write_bytes(b"\x93NUMPY" + bytes([version, 0]) + length + raw + payload)
    return path


def read(path: Path):
    return read_npy_header(path, file_size=path.stat().st_size)


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "int32", "int64"])
def test_reads_what_numpy_saves(tmp_path: Path, dtype: str) -> None:
    array = np.arange(7, dtype=dtype)
    np.save(tmp_path / "a.npy", array)
    header = read(tmp_path / "a.npy")
    assert (header.dtype, header.count) == (np.dtype(dtype), 7)
    raw = (tmp_path / "a.npy").read_bytes()
    assert np.frombuffer(raw, dtype=dtype, offset=header.data_offset).tolist() == array.tolist()


def test_version_2_and_3_headers(tmp_path: Path) -> None:
    for version in (2, 3):
        path = header_file(
            tmp_path / f"v{version}.npy",
            "{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }\n",
            b"\x01\x00\x02\x00",
            version=version,
        )
        assert read(path).count == 2


def test_written_header_is_fixed_size_and_numpy_loads_it(tmp_path: Path) -> None:
    for count in (0, 3, 10**19):
        assert len(npy_header(np.dtype("<u4"), count)) == NPY_HEADER_SIZE
    (tmp_path / "w.npy").write_bytes(npy_header(np.dtype("<u4"), 3) + np.arange(3, dtype="<u4").tobytes())
    assert np.load(tmp_path / "w.npy").tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    ("header", "payload", "error", "message"),
    [
        ("{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }", b"\0" * 4, TruncatedError, "needs 6 data bytes"),
        ("{'descr': '<u2', 'fortran_order': False, 'shape': (1,), }", b"\0" * 4, FormatError, "needs 2 data bytes"),
        ("{'descr': '<u2', 'fortran_order': False, 'shape': (2, 1), }", b"\0" * 4, FormatError, "2-D"),
        ("{'descr': '<u2', 'fortran_order': False, 'shape': (), }", b"\0" * 2, FormatError, "0-D"),
        ("{'descr': '<u2', 'fortran_order': True, 'shape': (2,), }", b"\0" * 4, FormatError, "fortran_order"),
        ("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", b"\x80\x04", UnsafeFormatError, "object"),
        ("{'descr': '>u2', 'fortran_order': False, 'shape': (2,), }", b"\0" * 4, FormatError, "big-endian"),
        ("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", b"\0" * 4, FormatError, "cannot hold token"),
        ("{'descr': '<i2', 'fortran_order': False, 'shape': (1,), }", b"\0" * 2, FormatError, "cannot hold token"),
        ("{'descr': [('a', '<u2')], 'fortran_order': False, 'shape': (1,), }", b"\0" * 2, FormatError, "structured"),
        ("{'descr': 'nonsense', 'fortran_order': False, 'shape': (1,), }", b"", FormatError, "not a numpy dtype"),
        ("{'descr': '<u2', 'shape': (1,), }", b"\0" * 2, FormatError, "expected the keys"),
        ("{'descr': '<u2', 'fortran_order': False, 'shape': (1,), 'x': 1}", b"\0\0", FormatError, "expected the keys"),
        ("{'descr': '<u2', 'fortran_order': False, 'shape': (-1,), }", b"", FormatError, "negative"),
        ("{'descr': '<u2', 'fortran_order': False, 'shape': (True,), }", b"\0" * 2, FormatError, "tuple of ints"),
        ("{'descr': '<u2', 'fortran_order': False, 'shape': [1], }", b"\0" * 2, FormatError, "tuple of ints"),
        ("{'descr': '<u2', 'fortran_order': False, 'shape': (10**30,), }", b"", FormatError, "not a Python literal"),
        ("__import__('os').system('true')", b"", FormatError, "not a Python literal"),
        ("[1, 2]", b"", FormatError, "expected the keys"),
        ("{" * 500, b"", FormatError, "not a Python literal"),
    ],
)
def test_bad_headers_raise_named_errors(tmp_path: Path, header: str, payload: bytes, error, message: str) -> None:
    path = header_file(tmp_path / "bad.npy", header, payload)
    with pytest.raises(error, match=message) as info:
        read(path)
    assert info.value.path == str(path)


def test_huge_shape_is_refused_before_any_allocation(tmp_path: Path) -> None:
    path = header_file(tmp_path / "big.npy", f"{{'descr': '<i8', 'fortran_order': False, 'shape': ({2**62},), }}")
    with pytest.raises(TruncatedError, match=f"needs {2**65} data bytes"):
        read(path)


def test_header_over_the_cap(tmp_path: Path) -> None:
    header = "{'descr': '<u2', 'fortran_order': False, 'shape': (1,), }" + " " * 10_000 + "\n"
    path = header_file(tmp_path / "long.npy", header, b"\0\0", version=2)
    with pytest.raises(ResourceLimitError, match="10000-byte cap") as info:
        read(path)
    assert info.value.field == "header_len"


@pytest.mark.parametrize(
    ("raw", "error", "message"),
    [
        (b"\x93NUMP", TruncatedError, "shorter than a .npy preamble"),
        (b"PK\x03\x04" + b"\0" * 20, FormatError, "magic"),
        (b"\x93NUMPY\x04\x00" + b"\0" * 20, FormatError, "version 4.0"),
        (b"\x93NUMPY\x02\x00\x10\x00", TruncatedError, "inside the .npy preamble"),
        (b"\x93NUMPY\x01\x00\x50\x00{'descr'", TruncatedError, "runs past the end"),
    ],
)
def test_bad_preambles(tmp_path: Path, raw: bytes, error, message: str) -> None:
    (tmp_path / "p.npy").write_bytes(raw)
    with pytest.raises(error, match=message):
        read(tmp_path / "p.npy")


def test_pickled_object_array_is_refused_without_unpickling(tmp_path: Path) -> None:
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(UnsafeFormatError, match="pickle"):
        read(tmp_path / "obj.npy")
