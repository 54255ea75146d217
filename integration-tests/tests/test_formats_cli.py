"""The formats commands as installed: `tokenloom inspect --plot` with matplotlib present, `validate` exit codes."""

import subprocess
import sys
from pathlib import Path

from tokenloom.formats import open_dataset, open_writer


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tokenloom.formats", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_inspect_plot_writes_a_png_histogram(tmp_path: Path) -> None:
    with open_writer(tmp_path / "ds", format="native", dtype="uint16", eos_id=0) as writer:
        for n in range(1, 60):
            writer.add([*range(1, n), 0])
    result = run("inspect", str(tmp_path / "ds"), "--plot", str(tmp_path / "lengths.png"))
    assert result.returncode == 0, result.stderr
    assert f"plot       {tmp_path / 'lengths.png'}" in result.stdout
    png = (tmp_path / "lengths.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 2000


def test_validate_exit_codes(tmp_path: Path) -> None:
    with open_writer(tmp_path / "ds", format="megatron", dtype="uint16") as writer:
        writer.add([1, 2, 3])
    assert run("validate", str(tmp_path / "ds")).returncode == 0
    (tmp_path / "ds.bin").write_bytes(b"\0")
    result = run("validate", str(tmp_path / "ds"))
    assert result.returncode == 1
    assert "TruncatedError" in result.stdout and "ds.bin" in result.stdout


def test_convert_command_to_megatron_and_back(tmp_path: Path) -> None:
    with open_writer(tmp_path / "ds", format="native", dtype="uint16", eos_id=0) as writer:
        for n in range(1, 30):
            writer.add([*range(1, n), 0])
    result = run("convert", str(tmp_path / "ds"), str(tmp_path / "m" / "train"), "--to", "megatron")
    assert result.returncode == 0, result.stderr
    assert "converted 29 entries" in result.stdout
    result = run("convert", str(tmp_path / "m" / "train.idx"), str(tmp_path / "back"), "--to", "native")
    assert result.returncode == 0, result.stderr
    source, back = open_dataset(tmp_path / "ds"), open_dataset(tmp_path / "back")
    assert [back[i].tolist() for i in range(len(back))] == [source[i].tolist() for i in range(len(source))]
