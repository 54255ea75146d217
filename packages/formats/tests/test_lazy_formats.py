"""The registry imports a format's folder when that format is first asked for (a native run loads no other)."""

from __future__ import annotations

import subprocess
import sys

NATIVE_RUN = """
import sys, tempfile
import tokenloom.formats as formats
with formats.open_writer(tempfile.mkdtemp() + "/out", dtype="uint16") as writer:
    writer.add([1, 2, 0])
loaded = sorted(m for m in sys.modules if m.startswith("tokenloom.formats."))
print(" ".join(loaded))
"""

SUFFIXES = """
import tokenloom.formats
from tokenloom.formats.io.source import data_suffixes
print(" ".join(data_suffixes()))
"""


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def test_writing_native_imports_neither_the_other_formats_nor_the_remote_layer():
    loaded = _run(NATIVE_RUN).split()
    assert "tokenloom.formats.native.writer" in loaded
    for other in ("flat", "megatron", "packed", "keyed", "remote", "_convert", "_buckets"):
        assert f"tokenloom.formats.{other}" not in loaded, other


def test_a_remote_listing_knows_every_format_data_suffix_before_any_format_was_asked_for():
    assert set(_run(SUFFIXES).split()) >= {".bin", ".npy", ".pbin", ".h5", ".hdf5"}


SUBPACKAGES = """
import tokenloom.formats as formats
print(formats.keyed.RECORD_FORMATS, formats.native.SPEC.name, formats.flat.__name__, formats.megatron.__name__,
      formats.packed.__name__, formats.remote.__name__)
"""


def test_the_format_folders_are_attributes_of_the_package_without_an_import_of_their_own():
    """``import tokenloom.formats`` then ``tokenloom.formats.keyed.RECORD_FORMATS`` worked when the package imported
    every folder; a folder imported on first use must still be reachable that way."""
    assert _run(SUBPACKAGES).split()[-1] == "tokenloom.formats.remote"
