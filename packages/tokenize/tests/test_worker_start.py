"""Issue #24 item 5 (speed): encoding workers fork from a fork server that imported tokenloom once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tokenloom.tokenize import default_tokenizer_path
from tokenloom.tokenize._executor import executor_for

_FIRST_TASK = """
import os, sys, time
from tokenloom.tokenize._executor import executor_for
if __name__ == "__main__":
    serialized = open(os.path.join(sys.argv[1], "tokenizer.json"), encoding="utf-8").read()
    with executor_for(2, sys.argv[1], serialized) as executor:  # each worker builds the tokenizer first (warm_up)
        print(executor.submit(time.process_time).result(), executor.submit(os.getppid).result(), os.getpid())
"""


def test_a_worker_starts_with_tokenloom_imported_and_almost_no_cpu_spent(tmp_path: Path) -> None:
    """A spawned worker spent about 0.3 CPU-s importing numpy and tokenloom before its first chunk; a worker
    forked from the fork server has them already (its CPU clock starts at the fork). Measured here: about
    0.35 CPU-s spawned, 0.05 forked, each including the tokenizer build of its warm-up task.

    In a script of its own: under pytest a worker also re-imports pytest's ``__main__`` (as spawn does).
    """
    script = tmp_path / "first_task.py"
    script.write_text(_FIRST_TASK, encoding="utf-8")
    out = subprocess.run(
        [sys.executable, str(script), str(default_tokenizer_path())], capture_output=True, text=True, check=True
    ).stdout.split()
    cpu, parent, owner = float(out[0]), int(out[1]), int(out[2])
    assert parent != owner  # the fork server's child, not the owner's
    assert cpu < 0.2, f"the worker spent {cpu:.2f} CPU-s before its first task"


def test_workers_see_the_owners_environment_as_it_is_when_the_pool_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fork server keeps the environment it started with; each pool's workers get the owner's current
    TOKENLOOM_/HF_/TOKENIZERS_ variables (TOKENLOOM_PROFILE, HF_HUB_OFFLINE, ...), set and unset."""
    tokenizer = str(default_tokenizer_path())
    monkeypatch.setenv("TOKENLOOM_TEST_GONE", "1")
    with executor_for(1, tokenizer, None) as executor:  # the server starts now (or started earlier)
        assert executor.submit(os.getenv, "TOKENLOOM_TEST_GONE").result(timeout=120) == "1"
    monkeypatch.delenv("TOKENLOOM_TEST_GONE")
    monkeypatch.setenv("TOKENLOOM_TEST_NEW", "yes")
    with executor_for(1, tokenizer, None) as executor:
        assert executor.submit(os.getenv, "TOKENLOOM_TEST_NEW").result(timeout=120) == "yes"
        assert executor.submit(os.getenv, "TOKENLOOM_TEST_GONE").result(timeout=120) is None


_OWNER = """
import os, sys, time
from tokenloom.tokenize._executor import executor_for
if __name__ == "__main__":
    with executor_for(2, sys.argv[1], None) as executor:
        pids = {executor.submit(os.getpid).result() for _ in range(20)}
        print(" ".join(map(str, sorted(executor._processes))), flush=True)
        time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[-1][:1] != "Z"  # a zombie has exited
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc to see whether a worker lives")
def test_workers_exit_when_their_owner_is_sigkilled(tmp_path: Path) -> None:
    """A SIGKILLed owner cannot stop its workers: the fork server exits (its pipe from the owner closes) and the
    workers' watchdog sees their parent change."""
    script = tmp_path / "owner.py"
    script.write_text(_OWNER, encoding="utf-8")
    owner = subprocess.Popen(
        [sys.executable, str(script), str(default_tokenizer_path())], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        workers = [int(pid) for pid in owner.stdout.readline().split()]
        assert len(workers) == 2 and all(_alive(pid) for pid in workers)
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=60)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in workers), "a worker outlived its SIGKILLed owner"
    finally:
        owner.kill()
        owner.wait(timeout=60)


def test_the_engine_probe_runs_in_a_worker_and_the_workers_encode_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With worker processes the probe runs in one of them (which keeps the encoder it chose); the ids are those
    of a one-process run, and the run's engine is the probe's."""
    import typing

    import numpy as np
    import orjson

    import tokenloom.tokenize._executor as executor_module
    from tokenloom.tokenize._executor import start_encoding
    from tokenloom.tokenize._transform import transform_for
    from tokenloom.tokenize._worker import EncodeOptions

    monkeypatch.setattr(executor_module, "THREAD_WORKERS_MAX", 0)  # worker processes, as with many workers
    from tokenloom.tokenize.inputs import discover_inputs, read_chunks

    texts = [f"document {i}: " + "word " * (i % 50) + "\u00e9\u6f22 end" for i in range(3000)]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(b"".join(orjson.dumps({"text": t}) + b"\n" for t in texts))
    files = discover_inputs(tmp_path / "in")
    tokenizer = str(default_tokenizer_path())
    options: dict[str, typing.Any] = {
        "eos_id": None,
        "text_field": "text",
        "engine": "auto",
        "verify_fraction": 0.001,
        "max_line_bytes": 1 << 20,
    }

    def chunks():
        return read_chunks(files, chunk_lines=200, chunk_bytes=1 << 20, max_line_bytes=1 << 20)

    with start_encoding(tokenizer, files, EncodeOptions(num_workers=2, **options)) as encoding:
        assert encoding.engine.name == "fast" and encoding.settings.engine == "fast"  # probed in a worker
        got = [result.tokens for result in transform_for(encoding.settings, tokenizer, encoding).encode(chunks())]
    with start_encoding(tokenizer, files, EncodeOptions(num_workers=0, **options)) as reference:
        want = [result.tokens for result in transform_for(reference.settings, tokenizer, reference).encode(chunks())]
        assert reference.engine.name == "fast"
    assert len(got) == len(want) == 15
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
