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


RACING_THREADS = """
import threading
import tokenloom.formats
from tokenloom.formats.io.source import data_suffixes
start = threading.Barrier(4)
seen = []

def ask():
    start.wait()
    seen.append(data_suffixes())

threads = [threading.Thread(target=ask) for _ in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
for found in seen:
    print(" ".join(found))
"""


def test_threads_asking_for_the_data_suffixes_at_once_all_get_the_whole_list():
    """The first answer registers every built-in format (imports that take milliseconds): a thread that asks
    meanwhile waits for it, never answering with the suffixes of the formats registered so far."""
    for _ in range(3):  # four real threads released together, in a fresh interpreter each time
        answers = _run(RACING_THREADS).split("\n")[:-1]
        assert len(answers) == 4
        assert len(set(answers)) == 1 and set(answers[0].split()) >= {".bin", ".npy", ".pbin", ".h5", ".hdf5"}
