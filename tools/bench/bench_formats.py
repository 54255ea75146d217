"""Benchmark of tokenloom.formats: opening, random entry access, native <-> megatron conversion.

Run (from the workspace root):

    uv run --group bench python tools/bench/bench_formats.py          # full, writes docs/benchmarks/formats.md
    uv run --group bench python tools/bench/bench_formats.py --quick  # smaller, prints only

Targets (issue 3): opening 1,000 native shards holding 10^9 tokens with fast
validation in < 0.5 s (it must not grow with the token count); ``ds[i]`` random
access >= 1 M documents/s in one process; native <-> megatron conversion of one
dtype >= 100 M tokens/s. Every figure is the median of >= 3 runs.

The 10^9-token datasets are sparse files (``truncate``), so building them costs
no disk space. Their .idx files and manifest are written directly (1,000
documents of 1,000 tokens per shard). Fast validation checks the manifest's
sizes and the checksums of the small index files only; the manifest still needs
a checksum for each data file (read by deep validation), and all data files are
the same zero-filled size, so that checksum is computed once and reused.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import struct
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tokenloom.formats import Manifest, convert_dataset, open_dataset, open_writer
from tokenloom.formats.io import FileEntry, file_checksum, write_manifest

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "docs" / "benchmarks" / "formats.md"
REPEATS = 3


def median_seconds(action: Callable[[], object], repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def build_native_sparse(root: Path, *, shards: int, docs_per_shard: int, doc_tokens: int) -> None:
    """``shards`` native shard pairs of zero tokens (sparse .bin), with their manifest."""
    root.mkdir(parents=True)
    count = docs_per_shard
    offsets = (np.arange(count + 1, dtype="<i8") * doc_tokens).tobytes()
    idx = struct.pack("<4sIII", b"GPTS", 1, 2, count) + offsets + np.zeros(count, "<u2").tobytes()  # GPT-Simple .idx
    bin_bytes = count * doc_tokens * 2
    files = []
    data_checksum = None
    for k in range(shards):
        stem = f"shard_{k:05d}"
        (root / f"{stem}.idx").write_bytes(idx)
        with open(root / f"{stem}.bin", "wb") as handle:
            handle.truncate(bin_bytes)
        if data_checksum is None:
            data_checksum = file_checksum(root / f"{stem}.bin")
        files.append(
            FileEntry(name=f"{stem}.idx", bytes=len(idx), xxh3_128=file_checksum(root / f"{stem}.idx"), role="index")
        )
        files.append(FileEntry(name=f"{stem}.bin", bytes=bin_bytes, xxh3_128=data_checksum, role="data"))
    write_manifest(
        root,
        Manifest(
            format="native",
            dtype="uint16",
            num_tokens=shards * count * doc_tokens,
            num_documents=shards * count,
            files=tuple(files),
            vocab_size=65536,
        ),
    )


def build_megatron_sparse(root: Path, *, shards: int, docs_per_shard: int, doc_tokens: int) -> list[str]:
    """The same tokens as ``shards`` Megatron prefixes (code 8 = uint16)."""
    root.mkdir(parents=True)
    count = docs_per_shard
    sizes = np.full(count, doc_tokens, dtype="<i4")
    pointers = (np.arange(count, dtype="<i8") * doc_tokens * 2).astype("<i8")
    documents = np.arange(count + 1, dtype="<i8")
    idx = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, count, count + 1)
    idx += sizes.tobytes() + pointers.tobytes() + documents.tobytes()
    prefixes = []
    for k in range(shards):
        prefix = root / f"part_{k:05d}_text_document"
        prefix.with_name(prefix.name + ".idx").write_bytes(idx)
        with open(prefix.with_name(prefix.name + ".bin"), "wb") as handle:
            handle.truncate(count * doc_tokens * 2)
        prefixes.append(str(prefix))
    return prefixes


def megatron_core_open() -> Callable[[list[str]], object] | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.datasets.indexed_dataset import IndexedDataset
    except ImportError:
        return None
    import logging

    logging.getLogger("megatron").setLevel(logging.WARNING)
    return lambda prefixes: [IndexedDataset(p) for p in prefixes]


def write_real_native(root: Path, tokens: int, doc_tokens: int) -> None:
    rng = np.random.default_rng(0)
    chunk_docs = max(1, (1 << 22) // doc_tokens)
    with open_writer(root, format="native", dtype="uint16", vocab_size=65536, shard_size_tokens=1 << 26) as writer:
        written = 0
        while written < tokens:
            docs = min(chunk_docs, (tokens - written) // doc_tokens) or 1
            writer.add_batch(rng.integers(0, 65536, size=docs * doc_tokens, dtype=np.uint16), np.full(docs, doc_tokens))
            written += docs * doc_tokens


def run(quick: bool, full: bool = False) -> str:
    """Run every benchmark and return the markdown report; the full run also writes it to ``REPORT``.

    ``full`` adds megatron-core's open beside tokenloom's (a peer, no target; its import takes 10-20 s here)."""
    shards = 100 if quick else 1000
    docs_per_shard = 1000
    doc_tokens = 1000
    total = shards * docs_per_shard * doc_tokens
    convert_tokens = 20_000_000 if quick else 200_000_000
    rows: list[tuple[str, str, str, str]] = []
    work = Path(tempfile.mkdtemp(prefix="tokenloom-bench-"))
    try:
        native = work / "native"
        build_native_sparse(native, shards=shards, docs_per_shard=docs_per_shard, doc_tokens=doc_tokens)
        opened = open_dataset(native)
        if (opened.num_tokens, opened.num_shards) != (total, shards):
            raise RuntimeError(f"benchmark dataset is wrong: {opened!r}")
        seconds = median_seconds(lambda: open_dataset(native, validate="fast"))
        rows.append(
            (
                f"open native, {shards:,} shards, {total:,} tokens, fast validation",
                f"{seconds:.3f} s",
                "< 0.5 s",
                "met" if seconds < 0.5 else "MISSED",
            )
        )
        bare = work / "gpt-simple"  # the same shards without manifest.json: GPT-Simple's pretokenize output
        bare.mkdir()
        for path in native.iterdir():
            if path.name != "manifest.json":
                os.link(path, bare / path.name)
        seconds = median_seconds(lambda: open_dataset(bare, validate="fast"))
        rows.append(
            (
                f"open GPT-Simple shards (no manifest), {shards:,} shards, fast validation",
                f"{seconds:.3f} s",
                "< 0.5 s",
                "met" if seconds < 0.5 else "MISSED",
            )
        )
        megatron = work / "megatron"
        prefixes = build_megatron_sparse(megatron, shards=shards, docs_per_shard=docs_per_shard, doc_tokens=doc_tokens)
        seconds = median_seconds(lambda: open_dataset(megatron, validate="fast"))
        rows.append((f"open megatron (tokenloom), {shards:,} prefixes, fast validation", f"{seconds:.3f} s", "-", "-"))
        peer = megatron_core_open() if full and not quick else None  # its import takes 10-20 s: --full only
        if peer is not None:
            seconds = median_seconds(lambda: peer(prefixes))
            rows.append((f"open megatron (megatron-core IndexedDataset x {shards:,})", f"{seconds:.3f} s", "-", "peer"))
        else:
            rows.append(
                (
                    "open megatron (megatron-core)",
                    "not run by --quick" if quick else "not installed" if full else "not run (no target: `--full`)",
                    "-",
                    "skipped",
                )
            )

        ds = opened
        lookups = 200_000 if quick else 500_000
        indices = np.random.default_rng(1).integers(0, len(ds), size=lookups).tolist()

        def access() -> None:
            for i in indices:
                ds[i]

        seconds = median_seconds(access)
        rate = lookups / seconds
        rows.append(
            (
                f"ds[i] random access ({lookups:,} lookups over {len(ds):,} documents)",
                f"{rate / 1e6:.2f} M docs/s",
                ">= 1 M docs/s",
                "met" if rate >= 1e6 else "MISSED",
            )
        )

        source = work / "real_native"
        write_real_native(source, convert_tokens, doc_tokens=2000)
        for label, src, to in (
            ("native -> megatron", source, "megatron"),
            ("megatron -> native", work / "conv" / "m_0", "native"),
        ):
            rates = []
            for attempt in range(REPEATS):
                target = work / "conv" / (f"m_{attempt}" if to == "megatron" else f"n_{attempt}")
                result = convert_dataset(src, target, to=to)
                rates.append(result.tokens / result.seconds)
            rate = statistics.median(rates)
            rows.append(
                (
                    f"convert {label}, {convert_tokens:,} uint16 tokens (incl. fsync, checksums)",
                    f"{rate / 1e6:.0f} M tokens/s",
                    ">= 100 M tokens/s",
                    "met" if rate >= 1e8 else "MISSED",
                )
            )
            if to == "megatron":
                for attempt in range(1, REPEATS):
                    for suffix in (".idx", ".bin"):
                        (work / "conv" / f"m_{attempt}{suffix}").unlink()
        # writer.add() one entry at a time: the cost per entry must not grow with the entries already written
        per_add = {}
        doc = np.arange(1, 11, dtype=np.int64)
        for count in (5_000, 50_000) if not quick else (2_000, 20_000):

            def write_entries(count: int = count) -> None:
                target = work / f"adds_{count}"
                shutil.rmtree(target, ignore_errors=True)
                with open_writer(target, dtype="uint16", vocab_size=100, eos_id=0) as writer:
                    for _ in range(count):
                        writer.add(doc)

            per_add[count] = median_seconds(write_entries) / count
        small, large = sorted(per_add)
        growth = per_add[large] / per_add[small]
        rows.append(
            (
                f"native writer, one add() per 10-token entry: {small:,} vs {large:,} entries",
                f"{per_add[small] * 1e6:.1f} vs {per_add[large] * 1e6:.1f} us per add ({growth:.2f}x)",
                "flat (< 1.5x)",
                "met" if growth < 1.5 else "MISSED",
            )
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    header = [
        "# tokenloom-formats benchmark",
        "",
        f"Command: `uv run --group bench python tools/bench/bench_formats.py{' --quick' if quick else ''}"
        f"{' --full' if full else ''}` "
        f"(medians of {REPEATS} runs).",
        "",
        f"Machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}, "
        f"numpy {np.__version__}; shared with other jobs, so figures are noisy.",
        "",
        "| benchmark | result | target | status |",
        "|---|---|---|---|",
    ]
    report = "\n".join(header + [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]) + "\n"
    if not quick:
        REPORT.parent.mkdir(parents=True, exist_ok=True)
        REPORT.write_text(report)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller datasets; print, do not write the report")
    parser.add_argument("--full", action="store_true", help="add megatron-core's open (a peer, 10-20 s of imports)")
    args = parser.parse_args()
    print(run(args.quick, args.full))
    if not args.quick:
        print(f"wrote {REPORT}")


if __name__ == "__main__":
    main()
