"""Review of issue 36's scratch-owner fold: eval-broadcast judges a build's scratch directory by formats.io's
holder_gone (as the writer lock judges its holder). Removed: provably dead owners of this host; kept: others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tokenloom.eval_broadcast import broadcast_eval_set
from tokenloom.formats.io import holder_record

HOST = os.uname().nodename


def _tokens() -> np.ndarray:
    return np.arange(20_000, dtype=np.int64) % 1000


def _scratch(cache: Path) -> set[str]:
    return {p.name for p in cache.iterdir() if p.name.startswith(".")}


def _with_owners(cache: Path, owners: dict[str, dict]) -> None:
    cache.mkdir(exist_ok=True)
    for name, owner in owners.items():
        (cache / name).mkdir()
        (cache / name / "owner.json").write_text(json.dumps(owner))


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_dead_and_reused_pids_of_this_host_are_removed_live_ones_kept(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    parent = {**holder_record(), "pid": os.getppid(), "process_start": None}
    _with_owners(
        cache,
        {
            ".eval-0a1b-build-dead": {**holder_record(), "pid": _dead_pid()},
            ".eval-0a1b-build-reused": {**holder_record(), "pid": os.getppid(), "process_start": "not-its-start"},
            ".eval-0a1b-build-live": parent,
            ".eval-0a1b-build-otherhost": {**holder_record(), "host": "elsewhere", "pid": _dead_pid()},
        },
    )
    built = broadcast_eval_set(_tokens, seq_len=99, cache_dir=cache, cache_key="k")
    assert built.origin == "built"
    assert _scratch(cache) == {".eval-0a1b-build-live", ".eval-0a1b-build-otherhost"}


def test_a_scratch_left_by_this_process_is_removed(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _with_owners(cache, {".eval-0a1b-build-mine": holder_record()})
    broadcast_eval_set(_tokens, seq_len=99, cache_dir=cache, cache_key="k")
    assert _scratch(cache) == set()


@pytest.mark.parametrize("pid", [0, -1])
def test_a_damaged_owner_pid_never_signals_a_group(tmp_path: Path, pid: int) -> None:
    """pid 0 / -1 in a damaged record: holder_gone's os.kill(pid, 0) probes a process group / every process;
    the directory is kept (conservative), and nothing is signalled (signal 0)."""
    cache = tmp_path / "cache"
    _with_owners(cache, {".eval-0a1b-build-odd": {**holder_record(), "pid": pid}})
    built = broadcast_eval_set(_tokens, seq_len=99, cache_dir=cache, cache_key="k")
    assert built.origin == "built" and Path(built.cache_path or "").is_dir()
