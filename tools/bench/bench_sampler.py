"""Benchmark tokenloom-sampler against torch's DistributedSampler.

Measures, each in a fresh subprocess (so peak memory is this measurement's own):

- time to the first index (construction + first ``next``) and the extra peak
  resident memory, for ResumableDistributedSampler at N = 10^8 and 10^10, for
  torch's DistributedSampler (randperm + tolist) at 10^8 and ``order="torch"`` (its
  O(N) compatibility mode) at 10^7;
- indices per second on one rank of 8, iterated with ``iter_chunks(65536)``,
  and per sample (Python ints) for reference.

Each figure is the median of 3 rounds; each round is one fresh process that runs every
row once, ours first (so its first index is a cold start), with VmHWM reset before each
row. The peer's per-sample iteration continues its first-index job (same N). ``--quick``
uses small N and one round (a smoke run; its numbers are not the published ones). The full
run writes docs/benchmarks/sampler.md. The peer's first index (``torch.randperm`` of 10^8 and its list: about
18 s and 4.6 GB each time, no issue target) runs in the first round only, unless ``--full``.

    uv run python tools/bench/bench_sampler.py [--quick | --full]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUTPUT = REPO / "docs" / "benchmarks" / "sampler.md"
RUNS = 3

_CHILD = r"""
import json, resource, sys, time

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20

def peak_mb():
    # VmHWM belongs to this address space; ru_maxrss would also count the parent's
    # pages copied before exec, which inflates every figure under the bench runner.
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0

def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass

import numpy as np, torch
from torch.utils.data import DistributedSampler
from tokenloom.sampler import ResumableDistributedSampler

class Length:
    def __init__(self, n): self.n = n
    def __len__(self): return self.n

def measure(kind, n, count):
    reset_peak()
    before = rss_mb()
    start = time.perf_counter()
    if kind == "first-feistel":
        next(iter(ResumableDistributedSampler(n, 8, 3, seed=1)))
    elif kind == "first-torch-order":
        next(iter(ResumableDistributedSampler(n, 8, 3, seed=1, order="torch")))
    elif kind == "first-distributed-sampler":  # then its per-sample iteration, timed on its own
        iterator = iter(DistributedSampler(Length(n), 8, 3, seed=1))
        next(iterator)
        seconds = time.perf_counter() - start
        peak = max(0.0, peak_mb() - before)
        start, done = time.perf_counter(), 0
        for _ in iterator:
            done += 1
            if done >= count:
                break
        return {"seconds": seconds, "peak_mb": peak, "iter_seconds": time.perf_counter() - start}
    elif kind == "chunks":
        sampler, done = ResumableDistributedSampler(n, 8, 3, seed=1), 0
        while done < count:  # across epochs when one rank's share is smaller than count
            for chunk in sampler.iter_chunks(65536):
                done += len(chunk)
                if done >= count:
                    break
    elif kind == "samples":
        sampler, done = ResumableDistributedSampler(n, 8, 3, seed=1), 0
        while done < count:
            for _ in sampler:
                done += 1
                if done >= count:
                    break
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_mb": max(0.0, peak_mb() - before)}

for job, (kind, n, count, repeats) in enumerate(json.loads(sys.argv[1])):
    for _ in range(repeats):
        print(json.dumps({"job": job, **measure(kind, n, count)}), flush=True)
"""


Job = tuple[str, int, int, int]  # kind, N, count, runs in this process


def _child(jobs: list[Job]) -> list[list[dict[str, float]]]:
    """Run ``jobs`` in one fresh process, in order; every run of every job."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(jobs)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
        env=env,
    )
    runs: list[list[dict[str, float]]] = [[] for _ in jobs]
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            runs[record.pop("job")].append(record)
    return runs


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def _n(value: int) -> str:
    exponent = len(str(value)) - 1
    return f"10^{exponent}" if value == 10**exponent else f"{value:,}"


PEER_JOB = "first-distributed-sampler"


def run(quick: bool, full: bool = False) -> str:
    """Run the benchmark; return it as markdown (the full run is what docs/ quotes)."""
    small, large = (10**6, 10**8) if quick else (10**8, 10**10)
    rounds = 1 if quick else RUNS
    iterate = 2 * 10**6 if quick else 10**7
    per_sample = 10**5 if quick else 2 * 10**6
    # ours first, so that each round's first index is a cold start of the sampler code; the torch
    # peer's first-index job then iterates per_sample more indices of its list (same N)
    jobs: list[tuple[str, Job]] = [
        ("ResumableDistributedSampler (feistel)", ("first-feistel", small, 0, 1)),
        ("ResumableDistributedSampler (feistel)", ("first-feistel", large, 0, 1)),
        # the O(N) compatibility order at N / 10: at N it is a third of the section's time (12 s a round)
        ('ResumableDistributedSampler (order="torch")', ("first-torch-order", small // 10, 0, 1)),
        ("torch DistributedSampler (randperm)", ("first-distributed-sampler", small, per_sample, 1)),
        (f"iter_chunks(65536), N = {_n(large)}", ("chunks", large, iterate, 1)),
        (f"iter_chunks(65536), N = {_n(small)}", ("chunks", small, iterate, 1)),
        (f"per sample (Python ints), N = {_n(large)}", ("samples", large, per_sample, 1)),
    ]
    # each round is a fresh process running every job once, in this order (peak memory: VmHWM is reset
    # before each job, so each figure is that job's own)
    # the peer's randperm (18 s a run, no target) in the first round only, unless --full
    per_round = [
        _child([job if full or number == 0 or job[0] != PEER_JOB else (*job[:3], 0) for _, job in jobs])
        for number in range(rounds)
    ]
    results = [_median([r[i][0] for r in per_round if r[i]]) for i in range(len(jobs))]
    peer_runs = sum(1 for r in per_round if r[[job[0] for _, job in jobs].index(PEER_JOB)])
    rows = [(name, job[1], job[2], result) for (name, job), result in zip(jobs, results, strict=True)]
    first = [(name, n, result) for name, n, _, result in rows[:4]]
    peer_iter = {"seconds": first[-1][2]["iter_seconds"]}
    speed = [(name, count, result) for name, _, count, result in rows[4:]]
    speed.append((f"torch DistributedSampler per sample (after its randperm), N = {_n(small)}", per_sample, peer_iter))
    peer_note = f" (its first index: {peer_runs} run, the first round's; `--full` runs it every round)."
    machine = f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}"
    lines = [
        "## tokenloom-sampler" + (" (quick smoke run: small N, not the published figures)" if quick else ""),
        "",
        f"Machine: {machine}; shared with other work. Medians of {rounds} round(s); each round is one fresh "
        "process running every row once, in the order of the tables (ours first, so its first index is a cold "
        "start); peak memory is each row's own (VmHWM reset before it).",
        f"Command: `uv run python tools/bench/bench_sampler.py{' --quick' if quick else ''}"
        f"{' --full' if full else ''}`; "
        "every row is rank 3 of 8 replicas.",
        "",
        "The peer (and the raw baseline: one `torch.randperm`) is torch's DistributedSampler; "
        "ratios are to it at the same N where it was measured" + (peer_note if peer_runs < rounds else "."),
        "",
        "| sampler | N | time to first index | vs torch DistributedSampler | extra peak memory |",
        "|---|---|---|---|---|",
    ]
    peer = first[-1][2]
    for name, n, result in first:
        seconds, peak = result["seconds"], result["peak_mb"]
        ratio = f"{seconds / peer['seconds']:.4f}x" if n == small else "-"
        lines.append(f"| {name} | {_n(n)} | {seconds * 1000:,.1f} ms | {ratio} | {peak:,.0f} MB |")
    peer_rate = per_sample / speed[-1][2]["seconds"]
    lines += [
        "",
        "| iteration (one rank) | indices | indices/s | vs torch DistributedSampler per sample |",
        "|---|---|---|---|",
    ]
    for name, count, result in speed:
        rate = count / result["seconds"]
        lines.append(f"| {name} | {count:,} | {rate / 1e6:,.1f} M/s | {rate / peer_rate:.2f}x |")
    lines.append("")
    markdown = "\n".join(lines)
    if not quick:  # the full run is what docs/ and the README quote
        OUTPUT.parent.mkdir(parents=True, exist_ok=True)
        OUTPUT.write_text(markdown)
    return markdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small N, a smoke run; does not write docs/")
    parser.add_argument("--full", action="store_true", help="the peer's first index in every round (18 s each)")
    args = parser.parse_args()
    markdown = run(args.quick, args.full)
    print(markdown)
    if not args.quick:
        print(f"written to {OUTPUT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
