"""Benchmark opening huge datasets: time and RSS growth of open + first sample, every format, local files.

Each dataset has N entries (in ``run.py``: 10^8, ``--quick``: 10^6; on its own: 10^9) built sparsely: the
data file is a hole made by ``truncate``, every entry is empty except the last (which holds all T tokens),
so every index array is zeros but its last page, written with numpy memory maps in chunks. Opening
therefore reads the same index sizes a real dataset of N documents has, while building it costs seconds
and no disk; a scan over a real (dense) index costs disk bandwidth on top of what is measured here.

Every measurement is one fresh process (``TOKENLOOM_CACHE_DIR`` in the bench's temp dir): it warms the
imports by opening a tiny dataset of the same format, reads VmRSS from /proc/self/status, then opens the
big one and reads its first and last entries. "first open" is the first open of these file versions
(the streamed checks and derivations run, and the index cache records them); "reopen" is every open
after that. A ``.pbin`` index is a pickle that has to be parsed once (in RAM): the packed rows use
N = 10^6 and say so. Keyed stores have no per-record index beyond their (capped) meta.json: their rows
hold N tokens in one segment.

    uv run --group bench python tools/bench/bench_open.py            # 10^9 entries, minutes: on its own
    uv run --group bench python tools/bench/bench_open.py --entries 100000000   # what run.py measures

A 10^9-entry first open streams 8 GB of index per format (minutes on 2 cores), so ``run.py`` opens 10^8
(the reopen target is the same; reopen costs do not grow with N) and appends the last 10^9 report
(``docs/benchmarks/open-huge.md``) to its "measured separately" section.

``--native`` (and the end of run.py's section): open + first batch of a never-opened native dataset whose
manifest records index block hashes (the index is checked by block on first touch, not scanned), in a fresh
process per row, local at N = 10^6, 10^7, 10^8 and from SeaweedFS behind the fault proxy at 20 ms per request
at N = 10^6, 10^7; ``--full`` adds 10^9 local and 10^8 and 10^9 remote (1 GB and 12 GB uploads; written to
``docs/benchmarks/open-native-full.md``, which run.py appends to its "measured separately" section). Each row has
the in-process clock (wall and CPU) beside the whole process's wall and CPU seconds and the load average.

    uv run --group bench python tools/bench/bench_open.py --native --full
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
OUTPUT = REPO / "docs" / "benchmarks" / "open.md"
HUGE_OUTPUT = REPO / "docs" / "benchmarks" / "open-huge.md"  # the 10^9 run, outside run.py
NATIVE_FULL_OUTPUT = REPO / "docs" / "benchmarks" / "open-native-full.md"  # --native --full, outside run.py
RUN_PY_ENTRIES = 10**8
HUGE_ENTRIES = 10**9
TARGET_S = 1.0
TARGET_MB = 50
TOKENS = 1 << 20  # tokens of the last entry (uint16)
_CHUNK = 1 << 24

_CHILD = r"""
import json, sys, time
import numpy as np
from tokenloom.formats import open_dataset, open_store

def status():
    values = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(value.split()[0]) * 1024
    return values

kind, small, big, options = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])

def first_samples(path):
    if kind == "store":
        store = open_store(path, **options)
        int(np.asarray(store.fetch(0, 1, store.keys[0])).sum())
        return store, len(store)
    ds = open_dataset(path, **options)
    int(np.asarray(ds[0][:8]).sum()) + int(np.asarray(ds[len(ds) - 1][:8]).sum())
    return ds, len(ds)

first_samples(small)  # imports and code paths warm
with open("/proc/self/clear_refs", "w") as handle:
    handle.write("5")  # VmHWM restarts from VmRSS
before = status()
started = time.perf_counter()
opened, entries = first_samples(big)
elapsed = time.perf_counter() - started
after = status()  # measured while the dataset is still open
print(json.dumps({"seconds": elapsed, "entries": entries, "rss": after["VmRSS"] - before["VmRSS"],
                  "peak": max(0, after["VmHWM"] - before["VmRSS"])}))
"""


def _sparse(path: Path, size: int, writes: list[tuple[int, bytes]] = ()) -> None:  # type: ignore[assignment]
    with open(path, "wb") as handle:
        handle.truncate(size)
        for offset, data in writes:
            handle.seek(offset)
            handle.write(data)


def _i64(value: int) -> bytes:
    return np.array([value], dtype="<i8").tobytes()


def build_native(root: Path, n: int, *, manifest: bool) -> Path:
    from tokenloom.formats.io.manifest import Manifest, describe_files, write_manifest
    from tokenloom.formats.native.layout import HEADER, idx_size, pack_header

    root.mkdir(parents=True)
    dtype = np.dtype("uint16")
    _sparse(root / "shard.idx", idx_size(n), [(0, pack_header(dtype, n)), (HEADER.size + 8 * n, _i64(TOKENS))])
    _sparse(root / "shard.bin", 2 * TOKENS)
    if manifest:
        files = describe_files(root, [("shard.idx", "index"), ("shard.bin", "data")])
        write_manifest(
            root,
            Manifest(format="native", dtype="uint16", num_tokens=TOKENS, num_documents=n, files=files, eos_id=0),
        )
    return root


def build_megatron(root: Path, n: int) -> Path:
    import struct

    root.mkdir(parents=True)
    header = struct.pack("<9sQBQQ", b"MMIDIDX\x00\x00", 1, 8, n, 2)
    size = len(header) + 12 * n + 16
    documents_at = len(header) + 12 * n
    writes = [(0, header), (len(header) + 4 * (n - 1), np.array([TOKENS], "<i4").tobytes())]
    writes.append((documents_at + 8, _i64(n)))
    _sparse(root / "data.idx", size, writes)
    _sparse(root / "data.bin", 2 * TOKENS)
    return root


def build_flat_lengths(root: Path, n: int) -> Path:
    from tokenloom.formats.flat.npy import NPY_HEADER_SIZE, npy_header
    from tokenloom.formats.io.manifest import Manifest, describe_files, write_manifest

    root.mkdir(parents=True)
    dtype = np.dtype("uint16")
    _sparse(root / "shard.npy", NPY_HEADER_SIZE + 2 * TOKENS, [(0, npy_header(dtype, TOKENS))])
    _sparse(root / "document_lengths.i64", 8 * n, [(8 * (n - 1), _i64(TOKENS))])
    files = describe_files(root, [("shard.npy", "data"), ("document_lengths.i64", "index")])
    flat = {"document_boundaries": "lengths", "file_pattern": "*.npy", "shard_entries": [n]}
    write_manifest(
        root,
        Manifest(
            format="flat", dtype="uint16", num_tokens=TOKENS, num_documents=n, files=files, metadata={"flat": flat}
        ),
    )
    return root


def build_flat_npy(root: Path, n: int) -> Path:
    from tokenloom.formats.flat.npy import NPY_HEADER_SIZE, npy_header

    root.mkdir(parents=True)
    _sparse(root / "shard.npy", NPY_HEADER_SIZE + 2 * n, [(0, npy_header(np.dtype("uint16"), n))])
    return root


def build_packed(root: Path, n: int) -> Path:
    from tokenloom.formats.packed.pickle_safe import dump_int_tuples

    root.mkdir(parents=True)
    data = 2 * TOKENS
    index = dump_int_tuples([(0, 0)] * (n - 1) + [(0, data)])
    path = root / "data.pbin"
    _sparse(path, 12 + data + len(index), [(0, struct_pack("<QI", data, 2)), (12 + data, index)])
    return path


def struct_pack(fmt: str, *values: int) -> bytes:
    import struct

    return struct.pack(fmt, *values)


def build_store(root: Path, n: int) -> Path:
    root.mkdir(parents=True)
    (root / "meta.json").write_text(json.dumps({"sequence": {"shape": [n], "dtype": "int32"}}))
    _sparse(root / "sequence.bin", 4 * n)
    return root


def build_h5(root: Path, n: int) -> Path:
    import h5py

    root.mkdir(parents=True)
    with h5py.File(root / "data.h5", "w") as handle:
        handle.create_group("sequence").create_dataset("0", shape=(n,), dtype="int32")
    return root


CASES = [
    # (name, builder, kind, options, packed-size?)
    ("native, manifest", lambda r, n: build_native(r, n, manifest=True), "dataset", {}, False),
    ("native (GPT-Simple shard), no manifest", lambda r, n: build_native(r, n, manifest=False), "dataset", {}, False),
    ("megatron (MMIDIDX), no manifest", build_megatron, "dataset", {}, False),
    ("flat .npy + document lengths, manifest", build_flat_lengths, "dataset", {}, False),
    ("flat .npy, no manifest (N tokens, split=shard)", build_flat_npy, "dataset", {}, False),
    ("packed .pbin (pickled index), no manifest", build_packed, "dataset", {}, True),
    ("keyed bin + meta.json (N int32 elements)", build_store, "store", {}, False),
    ("keyed HDF5 (N int32 elements)", build_h5, "store", {}, False),
]


def _measure(kind: str, small: Path, big: Path, options: dict, env: dict[str, str]) -> dict:
    argv = [sys.executable, "-c", _CHILD, kind, str(small), str(big), json.dumps(options)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600, env=env)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fmt(result: dict) -> tuple[str, str, str]:
    if "error" in result:
        return ("error", result["error"][:80], "")
    return (f"{result['seconds']:.3f}", f"{result['rss'] / 2**20:.1f}", f"{result['peak'] / 2**20:.1f}")


_NATIVE_CHILD = r"""
import json, os, resource, sys, time
import numpy as np
from tokenloom.formats import RemoteOptions, open_dataset

def rss():
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmRSS"))

small, big, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
warm = open_dataset(small)  # imports and code paths warm (a tiny local dataset)
warm[0]
del warm
before, wall, cpu = rss(), time.perf_counter(), time.process_time()
remote = RemoteOptions.from_keywords(**options) if options else None
ds = open_dataset(big, remote=remote)
opened = time.perf_counter() - wall
first = [np.asarray(ds[i]) for i in range(8)]  # the first batch of a sequential loader: documents 0-7
first_s, first_cpu = time.perf_counter() - wall, time.process_time() - cpu
first_rss = rss() - before
rng = np.random.default_rng(0)
picks = [np.asarray(ds[int(i)]) for i in rng.integers(0, len(ds), 8)]  # a shuffled loader's: 8 random documents
rand_s = time.perf_counter() - wall - first_s
print(json.dumps({"entries": len(ds), "open": opened, "first": first_s, "first_cpu": first_cpu,
                  "random": rand_s, "rss": first_rss, "rss_random": rss() - before}))
"""


def _timed_child(argv: list[str], env: dict[str, str]) -> dict:
    """The child's own report plus whole-process wall and CPU seconds (interpreter start and imports included)."""
    before = os.times()
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, env=env)
    wall = time.perf_counter() - started
    after = os.times()
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return {**result, "process_wall": wall, "process_cpu": cpu, "load": os.getloadavg()[0]}


def _native_row(where: str, n: int, r: dict) -> str:
    if "error" in r:
        return f"| {where} | {n:,} | error: {r['error'][:70]} | | | | | | | | |"
    met = r["first"] < (1.0 if where.startswith("local") else 3.0) and r["rss"] < TARGET_MB * 2**20
    return (
        f"| {where} | {n:,} | {r['open']:.3f} | {r['first']:.3f} | {r['first_cpu']:.3f} | {r['random']:.3f} | "
        f"{r['rss'] / 2**20:.1f} | {r['rss_random'] / 2**20:.1f} | "
        f"{r['process_wall']:.2f} | {r['process_cpu']:.2f} | {r['load']:.1f} | "
        f"{'met' if met else 'MISSED'} |"
    )


def _without_index_hashes(root: Path) -> Path:
    """``root``'s files (hard links) under a manifest as written before index block hashes: the full-scan open."""
    import dataclasses

    from tokenloom.formats.io.manifest import read_manifest, write_manifest

    copy = root.with_name(root.name + "-before")
    copy.mkdir()
    for name in ("shard.idx", "shard.bin"):
        os.link(root / name, copy / name)
    manifest = read_manifest(root)
    files = tuple(dataclasses.replace(f, blocks=None) if f.role == "index" else f for f in manifest.files)
    write_manifest(copy, dataclasses.replace(manifest, files=files, checksum=""))
    time.sleep(2.1)  # (the index cache records no check of files changed in the last 2 s)
    return copy


def native_scaling(quick: bool, full: bool) -> str:
    """Open + first batch of a never-opened native dataset (manifest with index block hashes), local and from
    SeaweedFS behind the fault proxy at 20 ms per request, at growing N: the time must not grow with N."""
    local_sizes = [10**6] if quick else [10**6, 10**7, 10**8] + ([HUGE_ENTRIES] if full else [])
    remote_sizes = [10**6] if quick else [10**6, 10**7] + ([10**8, HUGE_ENTRIES] if full else [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-open-native-") as tmp:
        base = Path(tmp)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        small = build_native(base / "small", 1000, manifest=True)
        built = {n: build_native(base / f"n{n}", n, manifest=True) for n in sorted(set(local_sizes + remote_sizes))}
        for n in local_sizes:
            env["TOKENLOOM_CACHE_DIR"] = str(base / f"cache-local-{n}")  # never opened: a fresh index cache
            argv = [sys.executable, "-c", _NATIVE_CHILD, str(small), str(built[n]), "{}"]
            rows.append(_native_row("local", n, _timed_child(argv, env)))
            print("  ", rows[-1], flush=True)
            env["TOKENLOOM_CACHE_DIR"] = str(base / f"cache-before-{n}")  # the same files, no index block hashes
            argv = [sys.executable, "-c", _NATIVE_CHILD, str(small), str(_without_index_hashes(built[n])), "{}"]
            rows.append(_native_row("local, before (full scan)", n, _timed_child(argv, env)))
            print("  ", rows[-1], flush=True)
        try:
            from tokenloom.testing.servers import FaultProxy, SeaweedS3

            seaweed: Any = SeaweedS3(base / "s3")
            proxy: Any = FaultProxy(seaweed.endpoint)
        except (ImportError, FileNotFoundError) as exc:
            rows.append(f"| remote | - | skipped: {exc} | | | | | | | | | |")
            remote_sizes = []
            seaweed = proxy = None
        try:
            for n in remote_sizes:
                url = seaweed.upload_dir(built[n], f"open-{n}")
                options = {
                    "storage_options": seaweed.storage_options(endpoint=proxy.url),
                    "block_cache_dir": str(base / f"cache-remote-{n}"),
                }
                proxy.latency_seconds = 0.020
                argv = [sys.executable, "-c", _NATIVE_CHILD, str(small), url, json.dumps(options)]
                rows.append(_native_row("S3, 20 ms", n, _timed_child(argv, env)))
                proxy.latency_seconds = 0.0
                print("  ", rows[-1], flush=True)
        finally:
            if proxy is not None:
                proxy.close()
            if seaweed is not None:
                seaweed.stop()
    lines = [
        "## Open + first batch of a never-opened native dataset (index checked by block on first touch)",
        "",
        "Command: `uv run --group bench python tools/bench/bench_open.py --native"
        f"{' --quick' if quick else ''}"
        f"{' --full' if full else ''}`. One never-opened native dataset per N (manifest with index block hashes; "
        "built sparsely as above: the .idx has its full size), opened in a fresh process with a fresh index cache "
        "(remote: a fresh block cache, SeaweedFS behind the fault proxy adding 20 ms to every request, 8 MiB "
        "blocks). open s: `open_dataset`; first batch s: open + documents 0-7 (wall, and CPU s of this process); "
        "8 random s: then 8 random documents (a shuffled loader's batch: 8 more index blocks); RSS growth: VmRSS "
        "after the first batch (and after the 8 random documents) minus before the open (imports warmed on a tiny "
        "dataset). Whole process: the child's wall and CPU "
        "seconds from start to exit (interpreter start and imports included), beside the in-process clock. "
        "Targets: first batch < 1 s local, < 3 s remote, RSS growth < 50 MB; met when the time does not grow "
        "with N. 'local, before (full scan)': the same files under a manifest without index block hashes, opened "
        "the way every native dataset opened before (every offset scanned, the index checksummed), in the same run.",
        "",
        "| where | N | open s | first batch s | CPU s | 8 random s | RSS growth MB | after random MB | "
        "process wall s | process CPU s | load | status |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        *rows,
    ]
    return "\n".join(lines) + "\n"


def run(quick: bool, entries: int | None = None) -> str:
    """The section at ``entries`` (default: what run.py measures); 10^9 entries write open-huge.md instead."""
    n = entries or (10**6 if quick else RUN_PY_ENTRIES)
    n_packed = 10**5 if quick else 10**6
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-open-") as tmp:
        base = Path(tmp)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["TOKENLOOM_CACHE_DIR"] = str(base / "cache")
        built: list[tuple[str, int, str, Path, Path, str, dict]] = []
        for i, (name, builder, kind, options, packed) in enumerate(CASES):
            size = n_packed if packed else n
            try:
                small = builder(base / f"small{i}", 1000)
                started = time.perf_counter()
                big = builder(base / f"big{i}", size)
                built.append((name, size, f"{time.perf_counter() - started:.1f}", small, big, kind, options))
            except ImportError as exc:
                rows.append((name, size, "-", ("skipped", str(exc)[:60], ""), ("", "", "")))
        time.sleep(2.1)  # the index cache keeps nothing derived from files changed in the last 2 s (once, for all)
        for name, size, build_s, small, big, kind, options in built:
            first = _measure(kind, small, big, options, env)
            again = _measure(kind, small, big, options, env)
            rows.append((name, size, build_s, _fmt(first), _fmt(again)))
            print(f"   {name}: first {first}, reopen {again}", flush=True)
        order = [case[0] for case in CASES]
        rows.sort(key=lambda row: order.index(row[0]))  # a skipped case keeps its place
    lines = [
        "## Opening huge datasets (every format, local)",
        "",
        f"Command: `uv run --group bench python tools/bench/bench_open.py{' --quick' if quick else ''}"
        f"{'' if quick or n == HUGE_ENTRIES else f' --entries {n}'}`. "
        f"N = {n:,} entries (packed: {n_packed:,}), built sparsely (every entry empty but the last, which holds "
        f"{TOKENS:,} tokens): the index arrays have their full size, the data is a hole. One fresh process per "
        "figure; RSS growth = VmRSS after opening and reading the first and last entries minus VmRSS before "
        "(imports warmed on a tiny dataset of the same format); peak = VmHWM after minus VmRSS before. "
        "First open = first open of these file versions (streamed checks, derived offsets written to the index "
        "cache); reopen = any later open (process, rank or job). Target: < 1 s and < 50 MB on every reopen.",
        "",
        "| format | N | first open s | RSS growth MB | peak MB | reopen s | RSS growth MB | peak MB | status |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, size, _build, first, again in rows:
        try:
            met = float(again[0]) < TARGET_S and float(again[1]) < TARGET_MB and float(again[2]) < TARGET_MB
            status = "met" if met else "MISSED"
        except ValueError:
            status = again[0] or first[0]
        lines.append(f"| {name} | {size:,} | {' | '.join(first)} | {' | '.join(again)} | {status} |")
    section = "\n".join(lines) + "\n"
    if n < HUGE_ENTRIES:  # run.py's section: the never-opened native rows, local and remote, too
        section += "\n" + native_scaling(quick, full=False)
    if not quick:  # a smoke run must not replace the published figures
        output = HUGE_OUTPUT if n >= HUGE_ENTRIES else OUTPUT
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(section)
    return section


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10^6 entries instead of 10^9")
    parser.add_argument("--entries", type=int, default=HUGE_ENTRIES, help="N (default 10^9: open-huge.md)")
    parser.add_argument("--native", action="store_true", help="only the native open + first batch scaling rows")
    parser.add_argument("--full", action="store_true", help="with --native: 10^9 local, 10^8 and 10^9 remote too")
    args = parser.parse_args()
    if args.native:
        section = native_scaling(args.quick, args.full)
        if args.full:
            NATIVE_FULL_OUTPUT.write_text(section)
        print(section)
        return 0
    print(run(args.quick, None if args.quick else args.entries))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
