"""Benchmark what verifying every remote byte costs: reads from S3 (local SeaweedFS) with block checks on vs off.

One native dataset (one ``.bin`` with an xxh3-64 per 1 MiB block in its manifest), read whole by a fresh
process through the block cache at the default 8 MiB block size, summing every block's tokens (a consumer
that touches every byte):

- cold: a fresh cache directory per run (every block fetched, checked before it is published);
- warm: the cache already holds every block, in the page cache (each block checked the first time the
  process maps it); on and off read the same cache directory.

"off" sets the bench-only switch ``tokenloom.formats.remote.verify.ENABLED = False`` in the child. Each
run is a subprocess: wall seconds, and CPU seconds from ``getrusage(RUSAGE_CHILDREN)`` deltas (the child and
whatever it waited for); medians of the runs, on and off interleaved. Target: verification costs <= 5%
(status by the seconds spent in the checks, timed in the child, over the process's wall time without them).

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
import json, sys, time
import numpy as np
from tokenloom.formats import RemoteOptions, open_dataset
from tokenloom.formats.remote import verify
url, cache, options, enabled = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4] == "on"
verify.ENABLED = enabled
checking = [0.0]  # seconds spent in the checks themselves (at fetch and at first map)

def timed(function):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            checking[0] += time.perf_counter() - start
    return wrapper

from tokenloom.formats.remote import cache as cache_module
cache_module.read_problem = timed(cache_module.read_problem)
cache_module.BlockCache._map_problem = timed(cache_module.BlockCache._map_problem)
ds = open_dataset(url, remote=RemoteOptions.from_keywords(storage_options=options, block_cache_dir=cache))
total, wall, cpu = 0, time.perf_counter(), time.process_time()
for shard in ds.shards:
    tokens, step = shard.tokens, (8 << 20) // shard.dtype.itemsize
    for begin in range(0, shard.num_tokens, step):
        total += int(np.asarray(tokens[begin : begin + step]).sum(dtype=np.uint64))
print(json.dumps([total, time.perf_counter() - wall, time.process_time() - cpu, checking[0]]))
"""


def _write(root: Path, tokens: int) -> Path:
    from tokenloom.formats import open_writer

    rng = np.random.default_rng(0)
    with open_writer(root, format="native", dtype="uint16", vocab_size=50_000, eos_id=0) as writer:
        for _ in range(tokens // 1_000_000):
            writer.add(np.append(rng.integers(1, 50_000, size=999_999, dtype=np.uint16), np.uint16(0)))
    return root


def _child(url: str, cache: Path, options: dict, mode: str) -> tuple[float, float, int, float, float, float]:
    """(wall s, CPU s, checksum of the tokens, read-loop wall s, read-loop CPU s, s in checks) of one process."""
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
    total, read_wall, read_cpu, checking = json.loads(done.stdout)
    return wall, cpu, total, read_wall, read_cpu, checking


def _page_in(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                while handle.read(8 << 20):
                    pass


def measure(quick: bool) -> dict:
    from tokenloom.testing.servers import SeaweedS3

    tokens = 32_000_000 if quick else 64_000_000
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
            results: dict[str, list[tuple[float, ...]]] = {}
            sums = set()
            warm = tmp / "warm"  # one cache for both: checks are per process, the files are the same
            sums.add(_child(url, warm, options, "on")[2])
            for run in range(runs):
                for mode in ("on", "off") if run % 2 == 0 else ("off", "on"):
                    cold = _child(url, tmp / f"cold-{mode}-{run}", options, mode)
                    _page_in(warm)  # both modes start from the page cache (not the disk)
                    hot = _child(url, warm, options, mode)
                    results.setdefault(f"cold-{mode}", []).append(cold[:2] + cold[3:])
                    results.setdefault(f"warm-{mode}", []).append(hot[:2] + hot[3:])
                    sums.update((cold[2], hot[2]))
            if len(sums) != 1:
                raise SystemExit(f"the runs read different tokens: {sums}")
        finally:
            server.stop()
    for key, values in results.items():
        out[key] = {
            "wall": statistics.median(v[0] for v in values),
            "cpu": statistics.median(v[1] for v in values),
            "read_wall": statistics.median(v[2] for v in values),
            "read_cpu": statistics.median(v[3] for v in values),
            "checking": statistics.median(v[4] for v in values),
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
        "| read | checks | process wall s | process CPU s | cost (wall) | cost (CPU) | read loop MiB/s | "
        "read loop cost (wall) | s in checks | checks / process wall (off) | status |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for kind in ("cold", "warm"):
        on, off = m[f"{kind}-on"], m[f"{kind}-off"]
        wall_cost, cpu_cost = on["wall"] / off["wall"] - 1, on["cpu"] / off["cpu"] - 1
        loop_cost = on["read_wall"] / off["read_wall"] - 1
        share = on["checking"] / off["wall"]
        status = "met" if share <= 0.05 else "MISSED"  # the checks' own time: steadier than a difference of walls
        for label, row in (("off", off), ("on", on)):
            costs = f"{wall_cost:+.1%} | {cpu_cost:+.1%}" if label == "on" else "- | -"
            tail = (
                f"{loop_cost:+.1%} | {on['checking']:.3f} | {share:.1%} | {status}"
                if label == "on"
                else "- | - | - | -"
            )
            lines.append(
                f"| {kind} cache | {label} | {row['wall']:.2f} | {row['cpu']:.2f} | {costs} | "
                f"{mib / row['read_wall']:,.0f} | {tail} |"
            )
    lines += [
        "",
        "Status by the time spent in the checks themselves (timed inside the process, at fetch and at first map) "
        "over the whole process's wall time without checks: on this shared 2-core machine the difference of two "
        "walls (or CPU seconds) is noise of +-10%, larger than the cost. "
        "Process CPU counts the reading process, where every check runs (and the children it waited for); the "
        "object-store helper process that fetches is not in it. The read loop is timed inside the process, after "
        "the open: at memory speed (warm) the first-map check is a larger share of a loop that only sums tokens "
        "than of a training step.",
    ]
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
