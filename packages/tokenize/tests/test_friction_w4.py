"""First-hour friction (issue 35, item 9): the rate counts decompressed bytes, and --no-progress is quiet."""

from __future__ import annotations

import gzip
import subprocess
import sys
import uuid
from pathlib import Path

import orjson
import pytest
from tokenize_helpers import s3_cli_env

from tokenloom.tokenize import TokenizeConfig, tokenize
from tokenloom.tokenize._commands import _summary_lines
from tokenloom.tokenize._progress import RunRateColumn, progress_bar, rate_text


def _lines(n: int) -> bytes:
    return b"".join(orjson.dumps({"text": f"doc {i}: " + "the same words again " * 40}) + b"\n" for i in range(n))


def test_the_rate_counts_decompressed_bytes_not_compressed_ones(tmp_path: Path, tiny_tokenizer: Path) -> None:
    raw = _lines(400)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl.gz").write_bytes(gzip.compress(raw))
    stored = (tmp_path / "in" / "a.jsonl.gz").stat().st_size
    config = TokenizeConfig(
        input_dir=tmp_path / "in", output_dir=tmp_path / "out", tokenizer=str(tiny_tokenizer), num_workers=0
    )
    summary = tokenize(config)
    assert summary.bytes_read == stored and summary.text_bytes == len(raw) > 10 * stored
    assert summary.text_bytes_per_second * summary.seconds == pytest.approx(len(raw))
    printed = "\n".join(_summary_lines(summary))
    assert f"from {len(raw):,} decompressed bytes ({stored:,} input bytes as stored)" in printed
    assert f"{rate_text(len(raw), summary.seconds)} decompressed" in printed


def test_pack_counts_decompressed_bytes(tmp_path: Path, tiny_tokenizer: Path) -> None:
    from tokenloom.tokenize import pack

    raw = _lines(200)
    source = tmp_path / "a.jsonl.gz"
    source.write_bytes(gzip.compress(raw))
    summary = pack(source, tokenizer=str(tiny_tokenizer), num_workers=0)
    assert summary.bytes_read == source.stat().st_size and summary.text_bytes == len(raw)


def test_the_bar_advances_by_bytes_on_disk_and_shows_the_decompressed_rate(tmp_path: Path) -> None:
    from rich.progress import Progress

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl.gz").write_bytes(b"x" * 1000)
    with progress_bar(tmp_path / "in", enabled=True) as on_progress:
        assert on_progress is not None and getattr(on_progress, "text_bytes", False)  # it takes the 4th argument
        on_progress(3, 30, 500, 4000)
    now = [10.0]
    with Progress(RunRateColumn(), get_time=lambda: now[0], disable=True) as progress:
        task = progress.add_task("t", total=1000, text_bytes=0)
        now[0] += 2.0
        progress.update(task, advance=500, text_bytes=8_000_000)
        shown = RunRateColumn().render(progress.tasks[0]).plain
    assert shown == "4.0 MB/s decompressed"  # 8 MB of text in 2 s, not the 500 bytes read


def test_a_three_argument_callback_still_works(tmp_path: Path, tiny_tokenizer: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(_lines(50))
    seen: list[int] = []

    def on_progress(documents: int, tokens: int, source_bytes: int) -> None:
        seen.append(source_bytes)

    config = TokenizeConfig(
        input_dir=tmp_path / "in", output_dir=tmp_path / "out", tokenizer=str(tiny_tokenizer), num_workers=0
    )
    tokenize(config, on_progress=on_progress)
    assert sum(seen) == (tmp_path / "in" / "a.jsonl").stat().st_size


@pytest.mark.skipif(sys.platform != "linux", reason="a subprocess with the S3 server's variables")
def test_no_progress_prints_no_line_per_uploaded_shard(seaweed, tmp_path: Path, tiny_tokenizer: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(_lines(300))
    url = f"s3://{seaweed.bucket}/tok-{uuid.uuid4().hex[:8]}"
    env = s3_cli_env(seaweed, tmp_path / "cache")
    command = [
        str(Path(sys.executable).with_name("tokenloom")),
        "tokenize",
        *("--input-dir", str(tmp_path / "in"), "--output-dir", url, "--tokenizer", str(tiny_tokenizer)),
        *("--num-workers", "1", "--no-progress", "--shard-size-tokens", "3000"),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    shards = [k for k in seaweed.objects(url) if k.endswith(".bin")]
    assert len(shards) >= 3  # several shards were uploaded ...
    uploads = [line for line in done.stderr.splitlines() if "uploaded" in line]
    assert len(uploads) <= 1, done.stderr  # ... and said once for the run, not once per shard
