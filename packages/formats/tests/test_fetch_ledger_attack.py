"""Attack on the cache's fetch ledger (v1/readers/fetched-*.log): concurrent writers, a damaged line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tokenloom.formats.remote.cache import _ledger, _record_fetch, fetched_bytes
from tokenloom.formats.remote.client import ObjectInfo

OBJ = ObjectInfo("s3://bucket/data/shard.bin", "data/shard.bin", 10**9, '"0123abcd"')
IDENTITY = {OBJ.url: f"{OBJ.size}:{OBJ.etag}"}
_WRITER = """
import sys
from pathlib import Path
from tokenloom.formats.remote.cache import _record_fetch
from tokenloom.formats.remote.client import ObjectInfo
obj = ObjectInfo("s3://bucket/data/shard.bin", "data/shard.bin", 10**9, '"0123abcd"')
for _ in range(int(sys.argv[3])):
    _record_fetch(Path(sys.argv[1]), obj, int(sys.argv[2]))
"""


def test_processes_appending_at_once_leave_whole_lines(tmp_path):
    sizes, lines = (8388608, 77777777), 3000
    writers = [subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), str(s), str(lines)]) for s in sizes]
    assert all(w.wait(timeout=120) == 0 for w in writers)
    assert fetched_bytes(tmp_path, IDENTITY) == lines * sum(sizes)
    written = _ledger(tmp_path, OBJ.url, OBJ.etag, OBJ.size).read_bytes().split(b"\n")
    assert len(written) == 2 * lines + 1 and set(written) == {b"8388608", b"77777777", b""}


def test_a_damaged_line_costs_that_line_not_the_whole_ledger(tmp_path):
    _record_fetch(tmp_path, OBJ, 8192)
    ledger = _ledger(tmp_path, OBJ.url, OBJ.etag, OBJ.size)
    with open(ledger, "ab") as handle:
        handle.write(b"\x00\x00\x00\x00\x00\x00\x00\x00\n")  # the zero-filled tail a machine crash can leave
    _record_fetch(tmp_path, OBJ, 4096)
    assert fetched_bytes(tmp_path, IDENTITY) == 8192 + 4096  # was 0: the whole ledger was dropped
    assert fetched_bytes(Path(tmp_path)) == 8192 + 4096


def test_an_unreadable_ledger_folder_is_no_figure_and_no_error(tmp_path):
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "readers").write_bytes(b"")  # not a folder: every ledger under it is unreadable
    assert fetched_bytes(tmp_path, IDENTITY) == 0  # was NotADirectoryError (CurriculumDataset reads it at open)
    assert fetched_bytes(tmp_path) == 0
