"""An unreadable shard under a dataset is a StorageError naming it, in the process and in a DataLoader worker."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys

import pytest

from tokenloom.datasets import MemoryMappedDataset
from tokenloom.formats import StorageError


def test_unreadable_shard_simulated(native, monkeypatch):
    import builtins

    data = native([[1, 2, 3, 0], [4, 5, 0], [6, 7, 8, 9, 0]], eos_id=0)
    ds = MemoryMappedDataset(data.root, 3)
    real_open = builtins.open

    def guarded(file, *args, **kwargs):
        if str(file).endswith(".bin"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded)
    with pytest.raises(StorageError, match="EACCES") as info:
        ds[0]
    assert info.value.path is not None and info.value.path.endswith(".bin")


def test_unreadable_shard_for_real(native):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to drop the permission override; the simulated test covers it")
    data = native([[1, 2, 3, 0], [4, 5, 0]], eos_id=0)
    for shard in data.root.glob("*.bin"):
        shard.chmod(0)
    code = (
        "import sys\nfrom tokenloom.datasets import MemoryMappedDataset\nfrom tokenloom.formats import StorageError\n"
        "try:\n    MemoryMappedDataset(sys.argv[1], 3)[0]\nexcept StorageError as e:\n    print('ok', e.errno)\n"
    )
    done = subprocess.run(
        ["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-c", code, str(data.root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.strip() == f"ok {errno.EACCES}", done.stderr
