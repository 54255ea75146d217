"""Decompression bombs end in a named RecordError within seconds, holding at most about the line cap.

The bombs are built here, streaming (a MiB of zeros or newlines compressed again and again): a 2 GiB
zstd stream of NUL bytes without a newline is 65 KB on disk. The CLI runs in a child process whose
peak RSS is read from ``getrusage(RUSAGE_CHILDREN)`` by a small runner of its own.
"""

from __future__ import annotations

import gzip
import resource
import subprocess
import sys
from pathlib import Path

import pytest

zstandard = pytest.importorskip("zstandard")

CAP = 64 << 20  # --max-line-bytes' default
MIB = 1 << 20

RUNNER = """
import resource, subprocess, sys
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(proc.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
print(proc.stdout[-3000:] + proc.stderr[-3000:])
"""


def write_bomb(path: Path, fill: bytes, mib: int) -> Path:
    """``mib`` MiB of ``fill`` bytes, compressed by the suffix's codec a MiB at a time."""
    chunk = fill * MIB
    if path.name.endswith(".gz"):
        handle = gzip.open(path, "wb", compresslevel=9)  # noqa: SIM115 (closed below)
    else:
        handle = zstandard.ZstdCompressor(level=3).stream_writer(open(path, "wb"))  # noqa: SIM115 (closed with it)
    with handle:
        for _ in range(mib):
            handle.write(chunk)
    return path


def run_cli(input_dir: Path, out: Path, *extra: str) -> tuple[int, int, float, str]:
    """(exit code, peak RSS in MiB, CPU seconds, output) of ``tokenloom tokenize`` in a child process (CPU, not
    wall: a loaded machine stretches wall time, not the work)."""
    cli = Path(sys.executable).with_name("tokenloom")
    command = [str(cli), "tokenize", "--input-dir", str(input_dir), "--output-dir", str(out), "--no-progress", *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c", RUNNER, *command], capture_output=True, text=True, timeout=600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    first, _, output = proc.stdout.partition("\n")
    code, rss = (int(x) for x in first.split())
    return code, rss, seconds, output


@pytest.fixture(scope="module")
def baseline_mib(tmp_path_factory: pytest.TempPathFactory) -> int:
    """Peak RSS of the same CLI on a one-line input: the interpreter, the tokenizer and the workers."""
    root = tmp_path_factory.mktemp("baseline")
    (root / "in").mkdir()
    (root / "in" / "a.jsonl").write_bytes(b'{"text": "hello world"}\n')
    code, rss, _, output = run_cli(root / "in", root / "out")
    assert code == 0, output
    return rss


BOMBS = [
    # (file name, fill byte, MiB decompressed, what the error says)
    ("nul.jsonl.zst", b"\0", 2048, "line has 2147483648 bytes, over the cap of 67108864"),
    ("newlines.jsonl.zst", b"\n", 1024, "the line is blank"),
    ("nul.json.gz", b"\0", 512, "line has 536870912 bytes, over the cap of 67108864"),
]


@pytest.mark.parametrize(("name", "fill", "mib", "says"), BOMBS, ids=[b[0] for b in BOMBS])
def test_a_bomb_is_a_named_record_error_in_seconds_under_twice_the_cap(
    tmp_path: Path, baseline_mib: int, name: str, fill: bytes, mib: int, says: str
) -> None:
    (tmp_path / "in").mkdir()
    bomb = write_bomb(tmp_path / "in" / name, fill, mib)
    assert bomb.stat().st_size < 2 * MIB
    code, rss, seconds, output = run_cli(tmp_path / "in", tmp_path / "out")
    assert code == 1, output
    assert "RecordError" in output and says in output, output
    assert f"file {bomb}, record 1" in output, output
    assert "Traceback" not in output, output
    growth = rss - baseline_mib
    assert growth < 2 * CAP // MIB, f"peak RSS {rss} MiB, {growth} MiB over the baseline ({baseline_mib} MiB)"
    assert seconds < 30, f"{seconds:.1f} s"
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_plain_line_of_a_gigabyte_is_never_held_whole_when_units_are_cut(tmp_path: Path, baseline_mib: int) -> None:
    """--num-nodes cuts a plain .jsonl at line starts after each --unit-bytes: finding the end of a 1 GiB line
    (a sparse file of NUL) reads it a MiB at a time (it held the line whole: +1.5 GB)."""
    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / "big.jsonl"
    with open(path, "wb") as handle:
        handle.write(b'{"text": "a"}\n')
        handle.truncate(1 << 30)
    code, rss, seconds, output = run_cli(tmp_path / "in", tmp_path / "out", "--num-nodes", "1")
    assert code == 1, output
    assert f"line has {(1 << 30) - 14} bytes, over the cap of 67108864" in output, output
    assert f"file {path}, record 2" in output and "Traceback" not in output, output
    growth = rss - baseline_mib
    assert growth < 2 * CAP // MIB, f"peak RSS {rss} MiB, {growth} MiB over the baseline ({baseline_mib} MiB)"
    assert seconds < 60, f"{seconds:.1f} s"


def test_a_frame_with_a_window_over_128_mib_is_named_as_such_not_as_a_cut_file(tmp_path: Path, tiny_tokenizer) -> None:
    """A whole file made with zstd --long=28 needs a 256 MiB window, over the decoder's 128 MiB: it was named
    "truncated or corrupt ... copy or download it again", a remedy that cannot work (review of #35 item 2)."""
    from tokenloom.formats import DataError
    from tokenloom.tokenize import TokenizeConfig, tokenize

    (tmp_path / "in").mkdir()
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=28, enable_ldm=True)
    with open(tmp_path / "in" / "long.jsonl.zst", "wb") as raw:
        writer = zstandard.ZstdCompressor(compression_params=params).stream_writer(raw)  # no size: the window stays
        writer.write(b'{"text": "hello"}\n' * 100)
        writer.flush(zstandard.FLUSH_FRAME)
    config = TokenizeConfig(
        input_dir=tmp_path / "in", output_dir=tmp_path / "out", tokenizer=str(tiny_tokenizer), num_workers=0
    )
    with pytest.raises(DataError, match="needs a decoding window over 128 MiB") as info:
        tokenize(config)
    assert "copy or download it again" not in str(info.value) and "--long=27" in str(info.value)
