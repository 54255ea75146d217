"""Crash-safe writing: every writer has its own temp name, so concurrent writers of one file never collide."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tokenloom.formats.io import temp_base, temp_path

WRITER = """
import sys
from tokenloom.formats.io import atomic_write_bytes
path, me = sys.argv[1], sys.argv[2]
for i in range(150):
    atomic_write_bytes(path, (me * 4096).encode())
"""


def test_concurrent_writers_of_one_file_never_share_a_temp_name(tmp_path: Path) -> None:
    target = tmp_path / "a.jsonl.idx.npy"
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(target), str(k)], stderr=subprocess.PIPE, text=True)
        for k in range(6)
    ]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, errors
    content = target.read_bytes()
    assert len(content) == 4096 and len(set(content)) == 1  # one writer's complete bytes, never a mix
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]  # no temp file left behind


def test_temp_names_are_unique_and_map_back_to_the_final_name(tmp_path: Path) -> None:
    names = {temp_path(tmp_path / "shard_0.bin").name for _ in range(100)}
    assert len(names) == 100
    assert {temp_base(name) for name in names} == {"shard_0.bin"}
    assert temp_base("shard_0.bin.tmp") == "shard_0.bin"  # the old fixed name still maps back
