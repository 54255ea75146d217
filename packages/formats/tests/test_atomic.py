"""Crash-safe writing: every writer has its own temp name, so concurrent writers of one file never collide."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest

from tokenloom.formats.io import TMP_SUFFIX, temp_base, temp_path

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


FULL_DISK = """
import resource, signal, sys
import numpy as np
from tokenloom.formats import open_writer
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as ENOSPC on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[3]), resource.RLIM_INFINITY))
try:
    with open_writer(sys.argv[1], format=sys.argv[2], dtype="uint16", vocab_size=1000, eos_id=0) as writer:
        for i in range(400):
            writer.add(np.array([i % 999 + 1] * (i % 7 + 1) + [0], np.uint16))
except OSError as exc:
    print(exc.errno)
"""


@pytest.mark.parametrize(("fmt", "name"), [("megatron", "data"), ("packed", "train.pbin"), ("bin-meta", "store")])
@pytest.mark.parametrize("limit", [50, 2500])
def test_a_write_that_fails_for_lack_of_space_leaves_no_temp_file(tmp_path: Path, fmt: str, name: str, limit: int):
    """The abort's close flushes what is still buffered and fails again (the disk is still full): the temp file is
    removed all the same (it was left, as large as the disk allowed, by every writer)."""
    out = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(tmp_path / name), fmt, str(limit)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(errno.EFBIG)]
    assert not [p.name for p in tmp_path.rglob("*") if p.name.endswith(TMP_SUFFIX)]


H5_FULL_DISK = """
import resource, signal, sys
from tokenloom.formats import DataError, open_writer
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (50, resource.RLIM_INFINITY))  # h5py cannot even write the file's header
try:
    open_writer(sys.argv[1], format="h5", dtype="uint16")
except DataError as exc:
    print(type(exc).__name__)
"""


def test_an_hdf5_writer_that_cannot_create_its_file_leaves_no_temp_file(tmp_path: Path) -> None:
    pytest.importorskip("h5py")
    out = subprocess.run([sys.executable, "-c", H5_FULL_DISK, str(tmp_path / "s.h5")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["StorageError"]
    assert list(tmp_path.iterdir()) == []
