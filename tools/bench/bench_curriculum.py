"""Benchmark tokenloom-curriculum: loader throughput, schedule look-ups, plan construction, vs megatron-core.

- DataLoader(batch 8, 2 workers) samples/s through a CurriculumDataset of 3 window buckets
  (seq_len 2048, uint16) against the same loader over one MemoryMappedDataset of the same tokens;
- schedule look-ups per second, vectorised (10^7 contiguous positions): ``draws`` (phase, bucket,
  draw number) and ``locate`` (plus the in-bucket Feistel permutation);
- construction time and extra peak memory of a 10^12-token, 100-phase, 10-bucket schedule;
- side by side, megatron-core's BlendedDataset index build (``helpers.build_blending_indices``,
  what ``BlendedDataset._build_indices`` runs) at 10^8 samples for the same 10-way blend, against
  tokenloom's MixSchedule for it.

Each figure is the median of 3 runs in a fresh subprocess (after its imports; the peak-memory counter,
VmHWM, is reset before each run, so each run's extra peak is its own): tokenloom's plan and MixSchedule in one,
the two loaders in another; with ``--full``, megatron-core's in a third (10-20 s of imports and 9 s and 1 GB a run
here, and no issue target: the contrast). ``--quick`` shrinks every size (a smoke run; its numbers are not the
published ones).

    uv run --group bench python tools/bench/bench_curriculum.py [--quick | --full]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUTPUT = REPO / "docs" / "benchmarks" / "curriculum.md"
RUNS = 3

_CHILD = r"""
import json, sys, time

def peak_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0

def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0

def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass

import numpy as np

def measure(kind, arg):
    out = {}
    if kind == "construct":
        from tokenloom.sampler import CurriculumSchedule
        tokens, seq_len, phases, buckets = arg["tokens"], 2048, arg["phases"], 10
        weights = np.random.default_rng(0).random((phases, buckets))
        reset_peak(); base = rss_mb(); start = time.perf_counter()
        schedule = CurriculumSchedule([tokens // seq_len // buckets] * buckets, [tokens // buckets] * buckets,
                                      [tokens // phases] * phases, weights, seed=1)
        out["seconds"] = time.perf_counter() - start
        out["extra_mb"] = peak_mb() - base
        out["segments"] = len(schedule.segments)
        first = min(10**8, schedule.num_samples - arg["lookups"])
        positions = np.arange(first, first + arg["lookups"], dtype=np.int64)
        for name, look_up in (("draws_per_s", schedule.draws), ("locate_per_s", schedule.locate)):
            start = time.perf_counter()
            look_up(positions)
            out[name] = len(positions) / (time.perf_counter() - start)
    elif kind == "megatron":
        from megatron.core.datasets import helpers
        size = arg["samples"]
        weights = np.random.default_rng(0).random(10); weights /= weights.sum()
        reset_peak(); base = rss_mb(); start = time.perf_counter()
        dataset_index = np.zeros(size, dtype=np.int16)
        dataset_sample_index = np.zeros(size, dtype=np.int64)
        helpers.build_blending_indices(dataset_index, dataset_sample_index, weights, 10, size, False)
        out["seconds"] = time.perf_counter() - start
        out["extra_mb"] = peak_mb() - base
    elif kind == "mix":
        from tokenloom.sampler import MixSchedule
        size = arg["samples"]
        weights = np.random.default_rng(0).random(10); weights /= weights.sum()
        reset_peak(); base = rss_mb(); start = time.perf_counter()
        schedule = MixSchedule(weights)
        counts = schedule.counts(size)
        out["seconds"] = time.perf_counter() - start
        out["extra_mb"] = peak_mb() - base
    elif kind == "loader":
        import torch
        from torch.utils.data import DataLoader
        from tokenloom.curriculum import CurriculumConfig, CurriculumDataset, Phase
        from tokenloom.datasets import MemoryMappedDataset, collate
        from tokenloom.sampler import ResumableDistributedSampler
        root, samples = arg["root"], arg["samples"]
        if arg["what"] == "curriculum":
            phase = Phase(duration_tokens=samples * 2048, mix={"a": 0.5, "b": 0.3, "c": 0.2})
            config = CurriculumConfig(path=root, seq_len=2048, packing=False, curriculum=(phase,))
            ds = CurriculumDataset(config, seed=1)
            sampler = ResumableDistributedSampler(ds, shuffle=False, seed=1)
        else:
            ds = MemoryMappedDataset(root + "/all", 2048)
            sampler = ResumableDistributedSampler(ds, seed=1)
        loader = DataLoader(ds, sampler=sampler, batch_size=8, num_workers=2, collate_fn=collate)
        iterator = iter(loader)
        for _ in range(20):
            next(iterator)
        start = time.perf_counter(); count = 0
        for batch in iterator:
            count += len(batch["input_ids"])
            if count >= samples:
                break
        out["samples_per_s"] = count / (time.perf_counter() - start)
    return out

for job, (kind, arg, repeats) in enumerate(json.loads(sys.argv[1])):
    for _ in range(repeats):
        try:
            print(json.dumps({"job": job, **measure(kind, arg)}), flush=True)
        except ImportError as exc:  # megatron-core is in the bench group only
            print(json.dumps({"job": job, "error": f"{kind} not measured: {exc}"}), flush=True)
            break
"""


Job = tuple[str, dict, int]  # kind, its argument, runs in this process


def _child(jobs: list[Job]) -> list[list[dict]]:
    """Run ``jobs`` in one fresh process; every run of every job, in order."""
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(jobs)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    if result.returncode != 0:
        raise RuntimeError(f"{[kind for kind, _, _ in jobs]} failed:\n{result.stderr[-3000:]}")
    runs: list[list[dict]] = [[] for _ in jobs]
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if "error" in record:
                print(record["error"], file=sys.stderr)  # that job's list stays empty
                continue
            runs[record.pop("job")].append(record)
    return runs


def _median(runs: list[dict]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def _corpus(root: Path, samples: int) -> None:
    """Buckets a/b/c (50/30/20 % of the windows) and one dataset 'all' holding the same tokens."""
    import numpy as np

    from tokenloom.formats import open_writer

    rng = np.random.default_rng(0)
    shares = {"a": 0.5, "b": 0.3, "c": 0.2}
    parts = {}
    for name, share in shares.items():
        tokens = rng.integers(0, 50000, size=int(samples * share * 1.05 + 10) * 2049, dtype=np.int64)
        parts[name] = tokens
        for split in ("train", "val"):
            with open_writer(root / split / name, dtype="uint16", eos_id=50000, vocab_size=50304) as writer:
                body = tokens if split == "train" else tokens[: 4 * 2049]
                writer.add_batch(body, [len(body)])
    with open_writer(root / "all", dtype="uint16", eos_id=50000, vocab_size=50304) as writer:
        body = np.concatenate(list(parts.values()))
        writer.add_batch(body, [len(body)])


def run(quick: bool, full: bool = False) -> str:
    runs = 1 if quick else RUNS
    tokens = 10**10 if quick else 10**12
    phases = 10 if quick else 100
    megatron_samples = 10**6 if quick else 10**8
    loader_samples = 800 if quick else 12000
    lookups = 10**6 if quick else 10**7
    with tempfile.TemporaryDirectory() as work:
        _corpus(Path(work), loader_samples + 200)
        jobs: list[Job] = [
            ("construct", {"tokens": tokens, "phases": phases, "lookups": lookups}, runs),
            ("mix", {"samples": megatron_samples}, runs),
            ("megatron", {"samples": megatron_samples}, runs),
        ]
        loaders: list[Job] = [
            ("loader", {"root": work, "samples": loader_samples, "what": "curriculum"}, 1),
            ("loader", {"root": work, "samples": loader_samples, "what": "mmap"}, 1),
        ]
        if quick:  # a smoke run puts every job in one process, without megatron-core (its import is 10-20 s)
            measured = _child([*jobs[:2], *loaders])
            measured.insert(2, [])
        else:
            # megatron-core's import in a process of its own, with --full only (the contrast, no target)
            measured = [*_child(jobs[:2]), _child(jobs[2:])[0] if full else []]
            # the two loaders A/B in one process, round by round, so that drift in the machine's load
            # falls on both alike (their ratio is the target)
            rounds = _child(loaders * runs)
            measured += [
                [run for k, runs_of in enumerate(rounds) if k % 2 == which for run in runs_of] for which in (0, 1)
            ]
    results = [_median(runs) if runs else None for runs in measured]
    construct, mix, megatron, ours, baseline = results
    if construct is None or mix is None or ours is None or baseline is None:
        raise RuntimeError("a tokenloom measurement returned nothing (see stderr)")
    ratio = ours["samples_per_s"] / baseline["samples_per_s"]
    lines = [
        "## curriculum",
        "",
        f"Medians of {runs} run(s) in fresh processes (tokenloom's plan and schedule in one, the loaders in one"
        f"{', megatron-core in one' if full else ''}; peak memory reset before each run); "
        "the two loaders alternate A/B in one process." + (" QUICK smoke run: sizes shrunk." if quick else ""),
        "",
        "| what | figure | target |",
        "|---|---|---|",
        f"| DataLoader(batch 8, 2 workers), seq_len 2048: CurriculumDataset (3 buckets) | "
        f"{ours['samples_per_s']:,.0f} samples/s | |",
        f"| same loader over one MemoryMappedDataset of the same tokens | "
        f"{baseline['samples_per_s']:,.0f} samples/s | |",
        f"| ratio | {ratio:.2f}x | >= 0.9x |",
        f"| schedule look-ups, `draws` (phase, bucket, draw), {lookups:,} contiguous positions | "
        f"{construct['draws_per_s'] / 1e6:,.1f} M/s | >= 10 M/s |",
        f"| `locate` (+ in-bucket Feistel permutation) | {construct['locate_per_s'] / 1e6:,.1f} M/s | |",
        f"| build a {tokens:.0e}-token, {phases}-phase, 10-bucket plan ({construct['segments']:.0f} segments) | "
        f"{construct['seconds']:.2f} s, {construct['extra_mb']:.1f} MB extra peak | < 1 s, < 50 MB |",
        f"| tokenloom MixSchedule, 10-way blend, counts at {megatron_samples:.0e} samples | "
        f"{mix['seconds'] * 1e3:.1f} ms, {mix['extra_mb']:.1f} MB | |",
    ]
    if megatron is not None:
        lines.append(
            f"| megatron-core BlendedDataset index build (build_blending_indices), {megatron_samples:.0e} samples | "
            f"{megatron['seconds']:.2f} s, {megatron['extra_mb']:.0f} MB | |"
        )
    else:
        lines.append("| megatron-core BlendedDataset index build | not run (the contrast, no target: `--full`) | |")
    lines += [
        "",
        "megatron-core stores two arrays of the blend's length (int16 + int64: 10 bytes per sample) and "
        "builds them in C++; tokenloom computes each position's source on demand, so its build cost "
        "does not grow with the number of samples.",
        "",
    ]
    markdown = "\n".join(lines)
    if not quick:
        OUTPUT.parent.mkdir(parents=True, exist_ok=True)
        OUTPUT.write_text(markdown)
    return markdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(run(args.quick))


if __name__ == "__main__":
    main()
