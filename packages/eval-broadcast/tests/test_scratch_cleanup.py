"""A killed eval-cache build leaves its scratch directory; the next call removes it, never a live one (#21)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from tokenloom.eval_broadcast import broadcast_eval_set

# A real build in a real process that stops itself (SIGSTOP) once its writer is mid-write: the scratch
# directory exists and holds part of the rows. The test then SIGKILLs it, or lets it run on.
BUILDER = """
import os, signal, sys
import numpy as np
from tokenloom.eval_broadcast import broadcast_eval_set

def stop_in_the_writer(frame, event, arg):
    if event == "call" and frame.f_code.co_name == "add_batch":
        sys.setprofile(None)
        os.kill(os.getpid(), signal.SIGSTOP)

tokens = np.arange(100_000, dtype=np.int64) % 1000
sys.setprofile(stop_in_the_writer)
evalset = broadcast_eval_set(lambda: tokens, seq_len=99, cache_dir=sys.argv[1], cache_key="k")
print(evalset.origin, flush=True)
"""


def _tokens() -> np.ndarray:
    return np.arange(100_000, dtype=np.int64) % 1000


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def _start_builder(cache: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", BUILDER, str(cache)], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not _stopped(process.pid):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"the builder did not stop mid-write (exit {process.returncode})")
        time.sleep(0.02)
    return process


def _scratch(cache: Path) -> set[str]:
    return {p.name for p in cache.iterdir() if p.name.startswith(".")}


def test_a_sigkilled_builders_scratch_is_removed_and_a_live_builders_is_kept(tmp_path):
    cache = tmp_path / "cache"
    killed = _start_builder(cache)
    killed_scratch = _scratch(cache)
    assert len(killed_scratch) == 1
    [name] = killed_scratch
    assert any((cache / name).iterdir())  # part of the rows is on disk
    live = _start_builder(cache)  # a concurrent builder, alive (stopped mid-write)
    live_scratch = _scratch(cache) - killed_scratch
    assert len(live_scratch) == 1
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(30)
        assert _scratch(cache) == killed_scratch | live_scratch  # the kill leaves its scratch behind

        rerun = broadcast_eval_set(_tokens, seq_len=99, cache_dir=cache, cache_key="k")
        assert rerun.origin == "built"
        assert _scratch(cache) == live_scratch  # the dead writer's scratch is gone, the live one's kept
        again = broadcast_eval_set(_tokens, seq_len=99, cache_dir=cache, cache_key="k")
        assert again.origin == "cache" and _scratch(cache) == live_scratch

        live.send_signal(signal.SIGCONT)  # the live builder finishes: the entry is already there, identical
        out, _ = live.communicate(timeout=60)
        assert live.returncode == 0 and out.strip() == "built"
        assert _scratch(cache) == set()
        assert [p.name for p in cache.iterdir()] == [Path(rerun.cache_path or "").name]
    finally:
        for process in (killed, live):
            if process.poll() is None:
                process.kill()
                process.wait(30)


def test_a_scratch_directory_of_another_host_or_a_reused_pid_is_kept(tmp_path):
    """Only provably dead owners are removed: another host's builder, or a live pid, may be writing."""
    cache = tmp_path / "cache"
    cache.mkdir()
    keep = {
        ".eval-0a1b-build-otherhost": {"host": "another-node", "pid": 1, "process_start": "1"},
        ".eval-0a1b-build-livepid": {"host": os.uname().nodename, "pid": os.getppid(), "process_start": None},
    }
    for name, owner in keep.items():
        (cache / name).mkdir()
        (cache / name / "owner.json").write_text(json.dumps(owner))
    (cache / ".eval-0a1b-build-norecord").mkdir()  # its writer died before the record, moments ago: grace
    broadcast_eval_set(_tokens, seq_len=99, cache_dir=cache, cache_key="k")
    assert _scratch(cache) == {*keep, ".eval-0a1b-build-norecord"}


def test_an_old_scratch_directory_without_an_owner_record_is_removed_after_the_grace_period(tmp_path):
    """Scratch directories of builds killed before owner records existed (``.eval-<key>-<random>``)."""
    cache = tmp_path / "cache"
    old = cache / ".eval-0a1b-x7k2p9qz"
    old.mkdir(parents=True)
    (old / "shard_00000.bin").write_bytes(b"\0" * 4096)
    recent = cache / ".eval-0a1b-r3c3nt00"
    recent.mkdir()
    hours_ago = time.time() - 2 * 3600
    for path in (old / "shard_00000.bin", old):
        os.utime(path, (hours_ago, hours_ago))
    broadcast_eval_set(_tokens, seq_len=99, cache_dir=cache, cache_key="k")
    assert _scratch(cache) == {recent.name}
