"""Benchmark what verifying every remote byte costs: reads from S3 (local SeaweedFS) with block checks on vs off.

One native dataset (one ``.bin`` with an xxh3-64 per 1 MiB block in its manifest), read whole by a fresh
process through the block cache at the default 8 MiB block size, summing every block's tokens (a consumer
that touches every byte):

- cold: a fresh cache directory per run (every block fetched, checked before it is published);
- warm: the cache already holds every block (each checked the first time the process maps it).

"off" sets the bench-only switch ``tokenloom.formats.remote.verify.ENABLED = False`` in the child. Each
run is a subprocess: wall seconds, and CPU seconds from ``getrusage(RUSAGE_CHILDREN)`` deltas (the child and
whatever it waited for); medians of the runs, on and off interleaved. Target: verification costs <= 5%.

    uv run python tools/bench/bench_verify.py [--quick]

Writes docs/benchmarks/verify.md (the full run) and returns its section.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
OUTPUT = REPO / "docs" / "benchmarks" / "verify.md"
RUNS = 3

_CHILD = """
import json, sys
import numpy as np
from tokenloom.formats import open_dataset
from tokenloom.formats.remote import verify
url, cache, options, enabled = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4] == "on"
verify.ENABLED = enabled
ds = open_dataset(url, storage_options=options, cache_dir=cache)
total = 0
for shard in ds.shards:
    tokens, step = shard.tokens, (8 << 20) // shard.dtype.itemsize
    for begin in range(0, shard.num_tokens, step):
        total += int(np.asarray(tokens[begin : begin + step]).sum(dtype=np.uint64))
print(total)
"""


def _write(root: Path, tokens: int) -> Path:
    from tokenloom.formats import open_writer

    rng = np.random.default_rng(0)
    with open_writer(root, format="native", dtype="uint16", vocab_size=50_000, eos_id=0) as writer:
        for _ in range(tokens // 1_000_000):
            writer.add(np.append(rng.integers(1, 50_000, size=999_999, dtype=np.uint16), np.uint16(0)))
    return root


def _child(url: str, cache: Path, options: dict, mode: str) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, checksum of the tokens) of one reading process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, url, str(cache), json.dumps(options), mode],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, int(done.stdout)


def measure(quick: bool) -> dict:
    from tokenloom.formats.remote.local_servers import SeaweedS3

    tokens = 32_000_000 if quick else 96_000_000
    runs = 2 if quick else RUNS
    out: dict = {"tokens": tokens, "runs": runs}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        local = _write(tmp / "local", tokens)
        out["bytes"] = sum(p.stat().st_size for p in local.glob("*.bin"))
        server = SeaweedS3(tmp / "seaweed")
        try:
            url = server.upload_dir(local, f"verify-{uuid.uuid4().hex[:8]}")
            options = server.storage_options()
            results: dict[str, list[tuple[float, float]]] = {}
            sums = set()
            warm = {"on": tmp / "warm-on", "off": tmp / "warm-off"}
            for mode in ("on", "off"):  # fill each warm cache once
                sums.add(_child(url, warm[mode], options, mode)[2])
            for run in range(runs):
                for mode in ("on", "off") if run % 2 == 0 else ("off", "on"):
                    cold = _child(url, tmp / f"cold-{mode}-{run}", options, mode)
                    hot = _child(url, warm[mode], options, mode)
                    results.setdefault(f"cold-{mode}", []).append(cold[:2])
                    results.setdefault(f"warm-{mode}", []).append(hot[:2])
                    sums.update((cold[2], hot[2]))
            if len(sums) != 1:
                raise SystemExit(f"the runs read different tokens: {sums}")
        finally:
            server.stop()
    for key, values in results.items():
        out[key] = {
            "wall": statistics.median(v[0] for v in values),
            "cpu": statistics.median(v[1] for v in values),
            "walls": [v[0] for v in values],
        }
    return out


def report(m: dict) -> str:
    mib = m["bytes"] / 2**20
    lines = [
        "## verified bytes: remote reads with block checks on vs off",
        "",
        f"{m['tokens'] / 1e6:.0f} M uint16 tokens ({mib:.0f} MiB in one .bin, block hashes per 1 MiB), read whole by a "
        f"fresh process from S3 (local SeaweedFS) through the block cache at its default 8 MiB block; whole-process "
        f"wall and CPU seconds, medians of {m['runs']} runs, on and off interleaved. Target: <= 5% cost.",
        "",
        "| read | checks | wall s | CPU s | MiB/s (wall) | cost (wall) | cost (CPU) | status |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for kind in ("cold", "warm"):
        on, off = m[f"{kind}-on"], m[f"{kind}-off"]
        wall_cost, cpu_cost = on["wall"] / off["wall"] - 1, on["cpu"] / off["cpu"] - 1
        status = "met" if wall_cost <= 0.05 else "MISSED"
        for label, row in (("off", off), ("on", on)):
            extra = f"{wall_cost:+.1%} | {cpu_cost:+.1%} | {status}" if label == "on" else "- | - | -"
            lines.append(
                f"| {kind} cache | {label} | {row['wall']:.2f} | {row['cpu']:.2f} | {mib / row['wall']:,.0f} | {extra} |"
            )
    return "\n".join(lines) + "\n"


def run(quick: bool) -> str:
    text = report(measure(quick))
    if not quick:
        OUTPUT.parent.mkdir(parents=True, exist_ok=True)
        OUTPUT.write_text(text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    sys.stdout.write(run(parser.parse_args().quick))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
