"""One writer per output: the O_EXCL lock file, its stale-lock detection, convert under two processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from formats_helpers import write_counting_native

from tokenloom.formats import OutputLockedError, open_dataset
from tokenloom.formats.cli.commands import convert
from tokenloom.formats.io import lock_path, output_lock

# holds the lock mid-convert until the test creates the release file (120 s at most), then finishes
HOLD = """
import pathlib, sys, time
from tokenloom.formats import convert_dataset
release, deadline = pathlib.Path(sys.argv[3]), time.monotonic() + 120
def hold(_n):
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
convert_dataset(sys.argv[1], sys.argv[2], to="native", chunk_tokens=64, on_progress=hold)
print("done")
"""


@pytest.fixture
def native(tmp_path: Path) -> Path:
    return write_counting_native(tmp_path / "native", 60)


def _wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.05)


def test_second_convert_into_the_same_target_is_refused_naming_the_holder(native: Path, tmp_path: Path) -> None:
    target, release = tmp_path / "out", tmp_path / "release"
    first = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(native), str(target), str(release)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(lock_path(target))
        second = subprocess.run(
            [sys.executable, "-c", "from tokenloom.formats.cli.group import main; main()", "convert", str(native),
             str(target), "--to", "native", "--no-progress"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        release.touch()  # the holder was mid-convert all along: no fixed sleep to outlast the second start-up
        assert second.returncode == 1, second.stderr
        assert "OutputLockedError" in second.stderr and f"pid {first.pid}" in second.stderr
        assert socket.gethostname() in second.stderr
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err
    assert out.strip() == "done"
    assert not lock_path(target).exists()
    assert len(open_dataset(target)) == len(open_dataset(native))


def test_lock_of_a_dead_process_is_broken_with_a_warning(
    native: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = tmp_path / "out"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    lock_path(target).write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "started": "earlier"}))
    result = CliRunner().invoke(convert, [str(native), str(target), "--to", "native", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert any("stale writer lock" in r.getMessage() for r in caplog.records)
    assert not lock_path(target).exists()


def test_lock_held_on_another_host_is_never_broken(tmp_path: Path) -> None:
    target = tmp_path / "out"
    lock_path(target).write_text(json.dumps({"pid": 1, "host": "some-other-node", "started": "2026-01-01"}))
    with pytest.raises(OutputLockedError, match="some-other-node") as info, output_lock(target):
        pass
    assert info.value.path == str(lock_path(target))
    assert lock_path(target).exists()


def test_unreadable_lock_is_stale_only_after_the_grace_period(tmp_path: Path) -> None:
    target = tmp_path / "out"
    lock = lock_path(target)
    lock.write_bytes(b"")
    with pytest.raises(OutputLockedError, match="not yet written"), output_lock(target):
        pass
    old = time.time() - 3600
    os.utime(lock, (old, old))
    with output_lock(target) as held:
        assert json.loads(held.read_text())["pid"] == os.getpid()
    assert not lock.exists()


def test_a_symlinked_output_shares_the_lock(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    code = "import sys\nfrom tokenloom.formats.io import output_lock\nwith output_lock(sys.argv[1]):\n    pass\n"
    with output_lock(real):
        other = subprocess.run([sys.executable, "-c", code, str(link)], capture_output=True, text=True, timeout=60)
        with output_lock(link):  # the same process may nest (tokenize converting into its own OUT)
            pass
        assert lock_path(real).exists()
    assert other.returncode == 1 and "OutputLockedError" in other.stderr
    assert not lock_path(real).exists()


CLI = "from tokenloom.formats.cli import main; main()"


def _convert_cli(native: Path, target: Path) -> subprocess.CompletedProcess[str]:
    """`tokenloom convert` in its own process: a hang fails the test at the timeout instead of stalling CI."""
    argv = [sys.executable, "-c", CLI, "convert", str(native), str(target), "--to", "native", "--no-progress"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_a_fifo_where_the_lock_is_expected_is_a_named_error_not_a_hang(native: Path, tmp_path: Path) -> None:
    target = tmp_path / "out"
    os.mkfifo(lock_path(target))
    result = _convert_cli(native, target)
    assert result.returncode == 1
    assert "UnsafePathError" in result.stderr and "is a FIFO" in result.stderr, result.stderr
    assert f"rm {lock_path(target)}" in result.stderr
    assert not target.exists()
    code = "import sys\nfrom tokenloom.formats.io import output_lock\nwith output_lock(sys.argv[1]):\n    pass\n"
    api = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True, timeout=60)
    assert api.returncode == 1 and "UnsafePathError" in api.stderr


def test_a_lock_symlinked_to_dev_zero_is_a_named_error_without_reading_it(native: Path, tmp_path: Path) -> None:
    target = tmp_path / "out"
    lock_path(target).symlink_to("/dev/zero")
    code = (
        "import resource, sys\n"  # 512 MiB of address space: reading /dev/zero to the end would hit it at once
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 29, 1 << 29))\n"
        "from tokenloom.formats.io import output_lock\n"
        "with output_lock(sys.argv[1]):\n    pass\n"
    )
    api = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True, timeout=60)
    assert api.returncode == 1
    assert "UnsafePathError" in api.stderr and "symbolic link (to /dev/zero)" in api.stderr, api.stderr
    assert "MemoryError" not in api.stderr
    result = _convert_cli(native, target)
    assert result.returncode == 1 and "symbolic link" in result.stderr, result.stderr
    assert lock_path(target).is_symlink()  # not ours to delete: the message says to


def test_a_huge_regular_lock_file_is_read_only_up_to_the_cap(tmp_path: Path) -> None:
    target = tmp_path / "out"
    lock = lock_path(target)
    lock.write_bytes(b"{" + b" " * (8 << 20))
    with pytest.raises(OutputLockedError, match="not yet written"), output_lock(target):
        pass  # unreadable and new: treated like a lock whose writer has not written its name yet


def test_a_command_line_that_is_not_utf8_still_takes_the_lock(native: Path, tmp_path: Path) -> None:
    """The lock records the command line; an argument that is not UTF-8 (a latin-1 file name) made
    every locking command (convert, tokenize, pack) a bare TypeError from the JSON encoder."""
    source = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9"))
    native.rename(source)
    target = Path(os.fsdecode(bytes(tmp_path) + b"/out\xe9"))
    ran = subprocess.run(
        [sys.executable, "-c", "from tokenloom.formats.cli.group import main; main()", "convert", os.fsencode(source),
         os.fsencode(target), "--to", "native", "--no-progress"],
        capture_output=True, encoding="utf-8", errors="replace", timeout=120,
        env={**os.environ, "PYTHONIOENCODING": "utf-8", "PYTHONUTF8": "0", "LC_ALL": "C.UTF-8"},  # strict stdout
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert len(open_dataset(target)) == 59 and not lock_path(target).exists()


def test_temps_of_dead_writers_beside_a_file_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    """A writer SIGKILLed between write and rename leaves ``final.<pid>-<hex>.tmp``: a rerun removes it once
    that pid is gone; its own temp and other files' temps stay."""
    import subprocess
    import sys

    from tokenloom.formats.io import remove_dead_temps, temp_path

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    final = tmp_path / "out.pbin"
    gone = tmp_path / f"out.pbin.{int(dead.stdout)}-0a1b2c3d.tmp"
    mine, other = temp_path(final), tmp_path / f"other.pbin.{int(dead.stdout)}-0a1b2c3d.tmp"
    for path in (gone, mine, other):
        path.write_bytes(b"half")
    assert remove_dead_temps(final) == [gone]
    assert not gone.exists() and mine.exists() and other.exists()
