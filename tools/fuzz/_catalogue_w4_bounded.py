"""Catalogue rows for #35 items 2-3: decompression bombs (the line cap holds while streaming) and nodes started
with different --num-nodes (a named ConfigError, and units no node took are named)."""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

from _catalogue_base import Outcome, Run, _tokenizer, case

MIB = 1 << 20
#: Peak RSS a bomb may cost the whole CLI process: its start-up (~130 MiB with the tokenizer) and twice the
#: default 64 MiB line cap with room to spare; before #35 a 2 GiB bomb took 2.2 GB.
RSS_LIMIT_MIB = 400
SECONDS_LIMIT = 30

_RUNNER = """
import resource, subprocess, sys, time
started = time.perf_counter()
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(proc.stdout, end="")
print(proc.stderr, end="", file=sys.stderr)
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024
print(f"BOUNDS rss_mib={rss} seconds={time.perf_counter() - started:.1f}")
sys.exit(proc.returncode)
"""

_HF = """
import resource, sys, time
from tokenloom.formats import DataError
from tokenloom.hf_streaming import StreamingHuggingFaceDataset
started = time.perf_counter()
try:
    list(StreamingHuggingFaceDataset("json", "train", "text", 8, sys.argv[1], data_files=[sys.argv[2]]))
except DataError as exc:
    print(f"Error: {type(exc).__name__}: {exc}")
    code = 1
else:
    code = 0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
print(f"BOUNDS rss_mib={rss} seconds={time.perf_counter() - started:.1f}")
sys.exit(code)
"""


def _bomb(path: Path, fill: bytes, mib: int) -> Path:
    """``mib`` MiB of ``fill`` compressed a MiB at a time (a 2 GiB zstd bomb is 65 KB)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    chunk = fill * MIB
    if path.name.endswith(".gz"):
        with gzip.open(path, "wb", compresslevel=9) as handle:
            for _ in range(mib):
                handle.write(chunk)
        return path
    import zstandard

    with open(path, "wb") as raw:
        writer = zstandard.ZstdCompressor(level=3).stream_writer(raw)
        for _ in range(mib):
            writer.write(chunk)
        writer.flush(zstandard.FLUSH_FRAME)
    return path


def _bounded(says: str, rss_limit: int = RSS_LIMIT_MIB):
    def check(outcome: Outcome) -> str | None:
        text = outcome.stdout + outcome.stderr
        if says not in text:
            return f"the error does not say {says!r}"
        found = re.search(r"BOUNDS rss_mib=(\d+) seconds=([\d.]+)", text)
        if found is None:
            return "no RSS/time line"
        rss, seconds = int(found[1]), float(found[2])
        if rss > rss_limit:
            return f"peak RSS {rss} MiB (limit {rss_limit})"
        return f"{seconds:.0f} s (limit {SECONDS_LIMIT})" if seconds > SECONDS_LIMIT else None

    return check


def _tokenize_bomb(tmp: Path, name: str, fill: bytes, mib: int) -> list[str]:
    _bomb(tmp / "in" / name, fill, mib)
    cli = str(Path(sys.executable).with_name("tokenloom"))
    tokenize = [cli, "tokenize", "--input-dir", str(tmp / "in"), "--output-dir", str(tmp / "out"), "--no-progress"]
    return [sys.executable, "-c", _RUNNER, *tokenize, "--tokenizer", str(_tokenizer())]


@case("tokenize: a .jsonl.zst bomb (2 GiB of NUL, no newline) ends at the line cap, in seconds, in bounded memory",
      "bad input", "error", "RecordError")  # fmt: skip
def _(tmp: Path) -> Run:
    return Run(
        process=_tokenize_bomb(tmp, "bomb.jsonl.zst", b"\0", 2048),
        check=_bounded("line has 2147483648 bytes, over the cap of 67108864"),
    )


@case("tokenize: a .jsonl.zst of 1 GiB of newlines (a blank first line) ends at line 1 in bounded memory",
      "bad input", "error", "RecordError")  # fmt: skip
def _(tmp: Path) -> Run:
    return Run(process=_tokenize_bomb(tmp, "newlines.jsonl.zst", b"\n", 1024), check=_bounded("the line is blank"))


@case("tokenize: a .json.gz bomb (512 MiB of NUL, no newline) ends at the line cap in bounded memory",
      "bad input", "error", "RecordError")  # fmt: skip
def _(tmp: Path) -> Run:
    return Run(
        process=_tokenize_bomb(tmp, "bomb.json.gz", b"\0", 512),
        check=_bounded("line has 536870912 bytes, over the cap of 67108864"),
    )


@case("hf-streaming: a .jsonl.zst bomb (2 GiB of NUL, no newline) ends at max_line_bytes in bounded memory",
      "bad input", "error", "RecordError")  # fmt: skip
def _(tmp: Path) -> Run:
    bomb = _bomb(tmp / "bomb.jsonl.zst", b"\0", 2048)
    # the interpreter with torch and the tokenizer is ~700 MiB before a byte is read; the bomb added 2.2 GB
    check = _bounded("line has 2147483648 bytes, over the cap of 67108864 bytes", rss_limit=1000)
    return Run(process=[sys.executable, "-c", _HF, str(_tokenizer()), str(bomb)], check=check)


def _corpus(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("a.jsonl", "b.jsonl", "c.jsonl", "d.jsonl"):
        lines = (json.dumps({"text": f"{name} document {i}: " + "alpha beta " * (1 + i % 7)}) for i in range(30))
        (directory / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return directory


def _node(inputs: Path, out: Path, nodes: int | None, rank: int, *extra: str) -> list[str]:
    dealt = ["--num-nodes", str(nodes), "--node-rank", str(rank)] if nodes is not None else []
    return ["tokenize", "--input-dir", str(inputs), "--output-dir", str(out), "--tokenizer", str(_tokenizer()),
            *dealt, "--num-workers", "0", "--no-progress", *extra]  # fmt: skip


def _node_zero_of_two(inputs: Path, out: Path) -> None:
    from tokenloom.tokenize import TokenizeConfig, tokenize

    config = TokenizeConfig(
        input_dir=inputs, output_dir=out, tokenizer=str(_tokenizer()), num_nodes=2, node_rank=0, num_workers=0
    )
    tokenize(config)


def _names(out: Path, *words: str):
    def check(outcome: Outcome) -> str | None:
        text = outcome.stdout + outcome.stderr
        missing = [w for w in words if w not in text]
        if missing:
            return f"the error does not say {missing}"
        return f"{out}/manifest.json was published" if (out / "manifest.json").exists() else None

    return check


@case("tokenize: node 1 started with --num-nodes 3 joins a run node 0 planned with --num-nodes 2", "bad input",
      "error", "ConfigError")  # fmt: skip
def _(tmp: Path) -> Run:
    inputs, out = _corpus(tmp / "in"), tmp / "out"
    _node_zero_of_two(inputs, out)
    check = _names(out, "--num-nodes 3", "planned for --num-nodes 2", "Start every node of this run with --num-nodes 2")
    return Run(argv=_node(inputs, out, 3, 1), check=check)


@case("tokenize --finalize without --num-nodes, node 1 of 2 missing: its units named, with the recorded count",
      "bad input",
      "error", "DataError")  # fmt: skip
def _(tmp: Path) -> Run:
    inputs, out = _corpus(tmp / "in"), tmp / "out"
    _node_zero_of_two(inputs, out)
    missing = "2 of 4 units are not committed yet: 1 (b.jsonl), 3 (d.jsonl)"
    check = _names(out, missing, "--node-rank 1 of --num-nodes 2")
    return Run(argv=_node(inputs, out, None, 0, "--finalize"), check=check)
