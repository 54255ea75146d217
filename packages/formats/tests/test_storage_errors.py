"""OS failures in convert / open_dataset are StorageErrors; the CLI prints one line (issue #11)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from formats_helpers import refuse_opening, tmpfs, write_counting_native

from tokenloom.formats import StorageError, convert_dataset, open_dataset
from tokenloom.formats.cli.group import main
from tokenloom.formats.io import storage_error


@pytest.fixture
def native(tmp_path: Path) -> Path:
    return write_counting_native(tmp_path / "native", 400)


@pytest.mark.parametrize(
    ("code", "needle"),
    [(errno.ENOSPC, "MB free now"), (errno.EROFS, "writable"), (errno.EACCES, "permissions"), (errno.EIO, "I/O")],
)
def test_storage_error_says_what_to_do(tmp_path: Path, code: int, needle: str) -> None:
    error = storage_error(OSError(code, os.strerror(code), str(tmp_path / "f")), doing="writing")
    assert isinstance(error, StorageError) and error.errno == code
    assert needle in str(error) and str(tmp_path / "f") in str(error)


def test_simulated_full_disk_during_convert(native: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(StorageError, match="ENOSPC") as info:
        convert_dataset(native, tmp_path / "out", to="flat")
    assert info.value.errno == errno.ENOSPC


def test_cli_one_line_and_debug_traceback(native: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    args = ["convert", str(native), str(tmp_path / "out"), "--to", "flat", "--no-progress"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "StorageError" in result.output
    assert not (tmp_path / "out").exists()  # the failed run left nothing behind
    assert isinstance(CliRunner().invoke(main, ["--debug", *args]).exception, StorageError)


def test_missing_extra_is_one_line_exit_2(native: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "h5py", None)
    result = CliRunner().invoke(main, ["convert", str(native), str(tmp_path / "x.h5"), "--to", "h5", "--no-progress"])
    assert result.exit_code == 2, result.output
    assert 'pip install "tokenloom-formats[h5]"' in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def _tmpfs(point: Path, options: str):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting needs root; the simulated tests cover this case")
    return tmpfs(point, options)


def test_real_full_tmpfs_during_convert(native: Path, tmp_path: Path) -> None:
    with _tmpfs(tmp_path / "disk", "size=32k") as disk:
        result = CliRunner().invoke(main, ["convert", str(native), str(disk / "out"), "--to", "flat", "--no-progress"])
        assert result.exit_code == 1, result.output
        assert "ENOSPC" in result.output and "Traceback" not in result.output


def test_real_read_only_target(native: Path, tmp_path: Path) -> None:
    with _tmpfs(tmp_path / "ro", "size=32k,ro") as ro:
        result = CliRunner().invoke(main, ["convert", str(native), str(ro / "out"), "--to", "native", "--no-progress"])
        assert result.exit_code == 1, result.output
        assert "EROFS" in result.output and "writable" in result.output


def test_unreadable_shard_is_a_storage_error_in_open_and_validate(native: Path) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to drop the permission override")
    (native / "shard_00000.bin").chmod(0)
    code = (
        "import sys\nfrom tokenloom.formats import open_dataset, StorageError\n"
        "try:\n    open_dataset(sys.argv[1])[0]\nexcept StorageError as e:\n    print('ok', e.errno)\n"
    )
    prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable]
    done = subprocess.run([*prefix, "-c", code, str(native)], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == f"ok {errno.EACCES}", done.stderr
    validate = subprocess.run(
        [*prefix, "-c", "from tokenloom.formats.cli.group import main; main()", "validate", str(native)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert validate.returncode == 1, validate.stdout
    assert "EACCES" in validate.stdout


def test_simulated_unreadable_shard(native: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dataset = open_dataset(native)
    refuse_opening(monkeypatch, "shard_00000.bin")
    with pytest.raises(StorageError, match="EACCES"):
        dataset[0]


def test_unreadable_manifest_is_a_storage_error_not_an_unknown_layout(
    native: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by tools/fuzz/catalogue.py: detection could not read manifest.json and said "no reader recognises"."""
    import io

    refuse_opening(monkeypatch, "manifest.json", io)  # Path.read_bytes opens through io.open
    with pytest.raises(StorageError, match="EACCES") as info:
        open_dataset(native)
    assert info.value.path == str(native / "manifest.json")
    result = CliRunner().invoke(main, ["inspect", str(native)])
    assert result.exit_code == 1 and result.output.startswith("Error: StorageError: ") and "EACCES" in result.output


def test_mapping_an_index_names_a_directory_a_missing_file_and_maps_an_empty_one_as_none(tmp_path: Path) -> None:
    from tokenloom.formats.io.index_map import map_array, map_file

    (tmp_path / "empty.idx").write_bytes(b"")
    assert map_file(tmp_path / "empty.idx") is None
    assert map_array(tmp_path / "empty.idx", "<i8", 0, 0).tolist() == []
    (tmp_path / "one.idx").write_bytes(b"\x07")
    assert map_array(str(tmp_path / "one.idx"), "<u1", 0, 1).tolist() == [7]
    (tmp_path / "dir.idx").mkdir()
    (tmp_path / "dangling.idx").symlink_to(tmp_path / "nowhere")
    for name, code in (("dir.idx", errno.EISDIR), ("missing.idx", errno.ENOENT), ("dangling.idx", errno.ENOENT)):
        with pytest.raises(StorageError, match=f"\\({errno.errorcode[code]}\\) while mapping an index") as info:
            map_file(tmp_path / name)
        assert info.value.errno == code and info.value.path == str(tmp_path / name)
