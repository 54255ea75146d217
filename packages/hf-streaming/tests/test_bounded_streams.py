"""A zstd bomb in a jsonl source ends in the named RecordError in seconds, holding about the line cap."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

zstandard = pytest.importorskip("zstandard")

CAP = 64 << 20  # max_line_bytes' default
MIB = 1 << 20


def write_zstd_bomb(path: Path, fill: bytes, mib: int) -> Path:
    """``mib`` MiB of ``fill`` bytes: one compressed MiB frame, ``mib`` times (a zstd stream may hold many frames)."""
    path.write_bytes(zstandard.ZstdCompressor(level=3).compress(fill * MIB) * mib)
    return path


def test_a_zstd_bomb_without_a_newline_is_refused_in_seconds_under_twice_the_cap(tmp_path, tokenizer_dir):
    from conftest import READ_AND_PRINT_GROWTH

    bomb = write_zstd_bomb(tmp_path / "bomb.jsonl.zst", b"\0", 2048)
    small = tmp_path / "small.jsonl"
    small.write_bytes(b'{"text": "alpha beta"}\n' * 50)
    code = (
        "import resource, time\n"
        "from tokenloom.hf_streaming import StreamingHuggingFaceDataset\n"
        "from tokenloom.formats import RecordError\n"
        "def make(path):\n"
        f"    return StreamingHuggingFaceDataset('json', 'train', 'text', 8, {str(tokenizer_dir)!r}, "
        "data_files=[path])\n"
        f"list(make({str(small)!r}))  # the baseline: the tokenizer and the reader set up once\n"
        f"ds = make({str(bomb)!r})\n" + READ_AND_PRINT_GROWTH
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds, not wall: a loaded machine stretches wall time, not the work (about 8 CPU-s here)
    seconds = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert "ERR line has 2147483648 bytes, over the cap of 67108864 bytes" in proc.stdout, proc.stderr[-2000:]
    assert f"file {bomb}, offset 0" in proc.stdout
    growth = int(proc.stdout.split("GROWTH_MIB")[1])
    assert growth < 2 * CAP // MIB, f"peak RSS grew by {growth} MiB reading a 2 GiB zstd bomb"
    assert seconds < 30, f"{seconds:.1f} CPU-s"


def test_a_valid_zstd_source_reads_the_same_at_any_fill(tmp_path, tokenizer_dir, monkeypatch):
    """The bounded feed changes no byte: records read with a tiny feed equal those read with the default."""
    from tokenloom.hf_streaming import StreamingHuggingFaceDataset
    from tokenloom.tokenize.inputs import jsonl_zst

    lines = b"".join(b'{"text": "doc %d %s"}\n' % (i, b"word " * (i % 97)) for i in range(3000))
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(
        zstandard.ZstdCompressor().compress(lines[:50000]) + zstandard.ZstdCompressor().compress(lines[50000:])
    )

    def samples():
        ds = StreamingHuggingFaceDataset("json", "train", "text", 16, str(tokenizer_dir), data_files=[str(path)])
        return [s["input_ids"].tolist() for s in ds]

    default = samples()
    monkeypatch.setattr(jsonl_zst, "FEED_BYTES", 7)
    monkeypatch.setattr(jsonl_zst, "FILL_BYTES", 100)
    assert samples() == default and len(default) > 10


def test_a_frame_with_a_window_over_128_mib_is_named_as_such(tmp_path, tokenizer_dir):
    """Review: a whole .jsonl.zst made with zstd --long=28 was "cannot read: the zstd data is corrupt" with the
    hint "Check the path and --format"; it is the window, and the hint says how to recompress."""
    from tokenloom.formats import FormatError
    from tokenloom.hf_streaming import StreamingHuggingFaceDataset

    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=28, enable_ldm=True)
    path = tmp_path / "long.jsonl.zst"
    with open(path, "wb") as raw:
        writer = zstandard.ZstdCompressor(compression_params=params).stream_writer(raw)  # no size: the window stays
        writer.write(b'{"text": "hello"}\n' * 100)
        writer.flush(zstandard.FLUSH_FRAME)
    ds = StreamingHuggingFaceDataset("json", "train", "text", 16, str(tokenizer_dir), data_files=[str(path)])
    with pytest.raises(FormatError, match="needs a decoding window over 128 MiB") as info:
        list(ds)
    assert "--long=27" in str(info.value) and "corrupt" not in str(info.value)
