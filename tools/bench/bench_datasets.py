"""tokenloom-datasets benchmark: window reads, DataLoader throughput vs peers, worker RSS, first sample, packing plans.

    uv run --group bench python tools/bench/bench_datasets.py [--quick]

``run(quick)`` returns the markdown section and (full run only) writes docs/benchmarks/datasets.md
(under 2 minutes full, 35 s quick, on 2 cores).

How the figures are made robust on a shared, noisy machine:
- variants compared with each other run interleaved, round by round
  (A, B, C, ... then again with the order rotated), never one block each;
- each measurement first warms up (worker start-up plus 20 batches, or 2,000
  reads), then times a fixed amount of work;
- every figure is reported as min / median / max over >= 3 rounds, and ratios
  are ratios of medians measured in the same run.

Peers: litdata (TokensLoader StreamingDataset) and megatron-core GPTDataset
from the ``bench`` group, in process; MosaicML streaming (MDS) in a venv of its own
(``_mosaic_env.py``: it cannot join the workspace lock; made once, kept between runs), which
measures its own raw baseline A/B so that it is compared by ratio.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pickle
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from tokenloom.datasets import MemoryMappedDataset, best_fit_decreasing, collate, interleave, length_binned_greedy
from tokenloom.formats import Manifest, open_dataset
from tokenloom.formats.io import FileEntry, describe_files, write_manifest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _mosaic_env import mosaic_python

REPO = Path(__file__).resolve().parents[2]
SEQ = 2048
REPEATS = 3
WARMUP_BATCHES = 20
# Every loader names its start method: litdata.optimize() sets the global one to "spawn" with force=True,
# which made every loader measured after it start its workers from scratch (seconds each, and noisy).
START_METHOD = "fork"


@dataclass(frozen=True)
class Spread:
    low: float
    median: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(min(values), statistics.median(values), max(values))

    def cell(self, digits: int = 0) -> str:
        return f"{self.median:,.{digits}f} ({self.low:,.{digits}f}-{self.high:,.{digits}f})"


def log(message: str) -> None:
    sys.stderr.write(f"[bench_datasets {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def interleaved(variants: dict[str, Callable[[], float]], rounds: int) -> dict[str, Spread]:
    """Every variant once per round, the order rotated each round; min/median/max per variant."""
    names = list(variants)
    results: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            results[name].append(variants[name]())
            log(f"round {r} {name}: {results[name][-1]:,.0f}/s in {time.perf_counter() - start:.1f} s")
    return {name: Spread.of(values) for name, values in results.items()}


# -- data ------------------------------------------------------------------------------
def write_native(root: Path, num_tokens: int, *, doc_len: int = 1024, random_tokens: bool) -> None:
    """A one-shard native dataset of ``num_tokens`` uint16 tokens in ``doc_len`` entries.

    ``random_tokens=False`` makes the data file sparse (free at any size). The data
    file's checksum is a placeholder: opening checks sizes and the index checksum;
    only deep validation reads data checksums, and hashing 40 GB of holes is not
    what this benchmark measures.
    """
    root.mkdir(parents=True, exist_ok=True)
    data = root / "shard_00000.bin"
    with open(data, "wb") as handle:
        if random_tokens:
            rng = np.random.default_rng(0)
            for start in range(0, num_tokens, 1 << 24):
                handle.write(rng.integers(0, 50000, min(1 << 24, num_tokens - start), dtype=np.uint16).tobytes())
        else:
            handle.truncate(num_tokens * 2)
    count = -(-num_tokens // doc_len)
    offsets = np.minimum(np.arange(count + 1, dtype=np.int64) * doc_len, num_tokens)
    header = struct.pack("<4sIII", b"GPTS", 1, 2, count)  # GPT-Simple's .idx header
    (root / "shard_00000.idx").write_bytes(header + offsets.astype("<i8").tobytes() + np.zeros(count, "<u2").tobytes())
    files = (
        *describe_files(root, [("shard_00000.idx", "index")]),
        FileEntry("shard_00000.bin", num_tokens * 2, "0" * 32, "data"),
    )
    manifest = Manifest(
        format="native", dtype="uint16", num_tokens=num_tokens, num_documents=count, files=files, vocab_size=50000
    )
    write_manifest(root, manifest)


class RawWindows(Dataset):
    """The baseline: numpy memmap slicing + int64 + torch.from_numpy, one sample per call."""

    def __init__(self, path: Path, num_tokens: int) -> None:
        self.path, self.num_tokens = path, num_tokens
        self.tokens: np.ndarray | None = None

    def __len__(self) -> int:
        return self.num_tokens // (SEQ + 1)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self.tokens is None:
            self.tokens = np.memmap(self.path, dtype=np.uint16, mode="r")
        window = torch.from_numpy(self.tokens[index * (SEQ + 1) : (index + 1) * (SEQ + 1)].astype(np.int64))
        return {"input_ids": window[:-1], "labels": window[1:]}


# -- 1. one process ----------------------------------------------------------------------
def getitem_rate(dataset: Any, order: list[int]) -> float:
    start = time.perf_counter()
    for i in order:
        dataset[i]
    return len(order) / (time.perf_counter() - start)


# -- 2. DataLoader -----------------------------------------------------------------------
def loader_rate(make_loader: Callable[[], Any], batches: int) -> float:
    """Samples/s over ``batches`` batches after worker start-up and WARMUP_BATCHES."""
    iterator = iter(make_loader())
    for _ in range(WARMUP_BATCHES):
        next(iterator)
    start, seen = time.perf_counter(), 0
    for _ in range(batches):
        seen += len(next(iterator)["input_ids"])
    elapsed = time.perf_counter() - start
    del iterator
    return seen / elapsed


def torch_loader(dataset: Dataset, **kwargs: Any) -> Callable[[], DataLoader]:
    return lambda: DataLoader(
        dataset, batch_size=8, num_workers=2, shuffle=True, multiprocessing_context=START_METHOD, **kwargs
    )


def setup_litdata(tokens_path: Path, num_tokens: int, work: Path) -> Callable[[], Any]:
    import litdata
    from litdata.streaming.item_loader import TokensLoader

    out = work / "litdata"
    litdata.optimize(
        fn=functools.partial(_litdata_piece, str(tokens_path)),
        inputs=list(range(0, num_tokens, 1 << 22)),
        output_dir=str(out),
        chunk_size=(SEQ + 1) * 512,
        item_loader=TokensLoader(),
        num_workers=1,
        mode="overwrite",
        start_method="fork",  # optimize() otherwise forces "spawn" on every later DataLoader in this process
    )

    def make() -> Any:
        dataset = litdata.StreamingDataset(str(out), item_loader=TokensLoader(block_size=SEQ + 1), shuffle=True)
        return litdata.StreamingDataLoader(
            dataset, batch_size=8, num_workers=2, collate_fn=_litdata_collate, multiprocessing_context=START_METHOD
        )

    return make


def _litdata_piece(path: str, start: int):
    tokens = np.memmap(path, dtype=np.uint16, mode="r")
    yield torch.from_numpy(np.asarray(tokens[start : start + (1 << 22)], dtype=np.int64))


def _litdata_collate(batch: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    windows = torch.stack(batch).long()
    return {"input_ids": windows[:, :-1], "labels": windows[:, 1:]}


class _MegatronTokenizer:
    eod = 0
    pad = 1
    vocab_size = 50000
    unique_identifiers = {"class": "bench"}  # noqa: RUF012


def _megatron_collate(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {
        "input_ids": torch.stack([sample["tokens"] for sample in batch]),
        "labels": torch.stack([sample["labels"] for sample in batch]),
    }


def setup_megatron(tokens_path: Path, num_tokens: int, work: Path) -> Callable[[], Any]:
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
    from megatron.core.datasets.utils import Split

    prefix = str(work / "megatron" / "data")
    Path(prefix).parent.mkdir(exist_ok=True)
    tokens = np.memmap(tokens_path, dtype=np.uint16, mode="r")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for start in range(0, num_tokens, 1 << 22):
        piece = np.asarray(tokens[start : start + (1 << 22)])
        builder.add_document(torch.from_numpy(piece.astype(np.int64)), [len(piece)])
    builder.finalize(prefix + ".idx")
    indexed = IndexedDataset(prefix)
    config = GPTDatasetConfig(
        random_seed=1,
        sequence_length=SEQ,
        tokenizer=_MegatronTokenizer(),  # type: ignore[arg-type]
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,  # what flash-attention training sets; the mask would dominate otherwise
        path_to_cache=str(work / "megatron-cache"),
        mid_level_dataset_surplus=0.005,
    )
    count = num_tokens // (SEQ + 1)
    dataset = GPTDataset(indexed, prefix, np.arange(len(indexed.sequence_lengths)), count, Split.train, config)
    return torch_loader(dataset, collate_fn=_megatron_collate)


def mosaic_rates(tokens_path: Path, count: int, batches: int, rounds: int, work: Path) -> dict[str, Any]:
    """Raw and MDS rates measured A/B in an isolated environment, or why not."""
    try:
        python = mosaic_python()
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    command = [
        python,
        str(Path(__file__).with_name("_peer_mosaic.py")),
        *("--tokens", str(tokens_path), "--count", str(count), "--batches", str(batches)),
        *("--repeats", str(rounds), "--work", str(work)),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {done.returncode}: {tail[:160]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- 3. worker memory --------------------------------------------------------------------
def _memory(pid: int) -> tuple[float, float, float]:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]
    smaps = dict(line.split(":", 1) for line in rollup if ":" in line)

    def mib(value: str) -> float:
        return int(value.split()[0]) / 1024

    return mib(status["RssAnon"]), mib(status["VmRSS"]), mib(smaps.get("Pss_Anon", "0 kB"))


def worker_memory(dataset: MemoryMappedDataset, batches: int) -> tuple[float, float, float]:
    """(RssAnon, VmRSS, Pss_Anon) in MiB of a DataLoader worker after ``batches`` random batches (median of 2)."""
    loader = DataLoader(
        dataset, batch_size=8, num_workers=2, shuffle=True, collate_fn=collate, multiprocessing_context=START_METHOD
    )
    iterator = iter(loader)
    for _ in range(batches):
        next(iterator)
    readings = [_memory(worker.pid) for worker in iterator._workers]  # type: ignore[attr-defined]
    del iterator
    anon, rss, pss = zip(*readings, strict=True)
    return statistics.median(anon), statistics.median(rss), statistics.median(pss)


def memory_in_fresh_process(path: Path, runs: int = REPEATS) -> tuple[float, float, float, int, int]:
    """(RssAnon, VmRSS, Pss_Anon, pickled bytes, entries), measured by ``--memory`` in a new interpreter."""
    command = [sys.executable, __file__, "--memory", str(path), "--runs", str(runs)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    return tuple(json.loads(done.stdout.strip().splitlines()[-1]))  # type: ignore[return-value]


def memory_main(path: Path, runs: int) -> None:
    dataset = MemoryMappedDataset(path, SEQ)  # opened by path, as a training script does
    readings = [worker_memory(dataset, batches=200) for _ in range(runs)]
    anon, rss, pss = (statistics.median(values) for values in zip(*readings, strict=True))
    print(json.dumps([anon, rss, pss, len(pickle.dumps(dataset)), len(open_dataset(path))]))


# -- 5. packing plans --------------------------------------------------------------------
def plan_seconds(lengths: np.ndarray, capacity: int) -> dict[str, tuple[Spread, float]]:
    out: dict[str, tuple[Spread, float]] = {}
    for name, plan in (("best-fit decreasing", best_fit_decreasing), ("length-binned greedy", length_binned_greedy)):
        times, bins = [], np.empty(0)
        for _ in range(REPEATS):
            start = time.perf_counter()
            bins = plan(lengths, capacity)
            times.append(time.perf_counter() - start)
        waste = 1 - lengths.sum() / ((int(bins.max()) + 1) * capacity)
        out[name] = (Spread.of(times), waste)
    return out


def run(quick: bool) -> str:
    num_tokens = 10_000_000 if quick else 50_000_000
    getitem_count = 20_000 if quick else 100_000
    batches = 300 if quick else 600
    rss_sizes_gb = [1, 2] if quick else [1, 20]
    memory_runs = 1 if quick else REPEATS
    plan_docs = 1_000_000 if quick else 10_000_000
    loader_rounds = REPEATS
    lines = ["## tokenloom-datasets", ""]
    with tempfile.TemporaryDirectory(prefix="bench-datasets-") as tmp:
        work = Path(tmp)
        root = work / "native"
        write_native(root, num_tokens, random_tokens=True)
        tokens_path = root / "shard_00000.bin"
        ds = MemoryMappedDataset(root, SEQ)
        raw = RawWindows(tokens_path, num_tokens)

        # 1. __getitem__ in one process
        order = np.random.default_rng(1).integers(0, len(ds), getitem_count).tolist()
        for reader in (ds, raw):  # warm the page cache and the code paths
            getitem_rate(reader, order[:2000])
        one = interleaved({"raw": lambda: getitem_rate(raw, order), "ours": lambda: getitem_rate(ds, order)}, REPEATS)
        lines += [
            f"### Random `__getitem__`, 1 process\n\n{SEQ}-token windows of a uint16 shard of "
            f"{num_tokens / 1e6:.0f} M tokens, warm page cache, {getitem_count:,} reads per round, "
            f"A/B interleaved, median (min-max) of {REPEATS} rounds. Target: >= 0.7x raw.",
            "",
            "| reader | windows/s | vs raw |",
            "|---|---:|---:|",
            f"| raw numpy memmap + int64 + torch.from_numpy | {one['raw'].cell()} | 1.00x |",
            f"| tokenloom MemoryMappedDataset | {one['ours'].cell()} | {one['ours'].median / one['raw'].median:.2f}x |",
            "",
        ]

        # 2. DataLoader, with peers
        log("2. DataLoader, with peers")
        variants: dict[str, Callable[[], float]] = {
            "raw numpy per-sample dataset": lambda: loader_rate(torch_loader(raw), batches),
            "tokenloom, default_collate": lambda: loader_rate(torch_loader(ds), batches),
            "tokenloom, `collate`": lambda: loader_rate(torch_loader(ds, collate_fn=collate), batches),
        }
        peer_names: list[str] = []
        notes: dict[str, str] = {}
        for name, setup in (
            ("litdata TokensLoader StreamingDataset", setup_litdata),
            ("megatron-core GPTDataset", setup_megatron),
        ):
            if quick:  # a smoke run of our code paths: megatron-core's import alone takes 10-20 s
                notes[name] = "not run by --quick"
                continue
            try:
                start = time.perf_counter()
                make = setup(tokens_path, num_tokens, work)
                notes[name] = f"setup {time.perf_counter() - start:.1f} s"
                variants[name] = functools.partial(loader_rate, make, batches)
                peer_names.append(name)
            except Exception as exc:  # a peer that does not install or run is reported, not fatal
                notes[name] = f"not measured: {type(exc).__name__}: {str(exc)[:120]}"
        rates = interleaved(variants, loader_rounds)
        base = rates["raw numpy per-sample dataset"].median
        normalised = {name: rates[name].median / base for name in peer_names}
        log("mosaic")
        mosaic = (
            {"error": "not run by --quick (it builds an isolated environment)"}
            if quick
            else mosaic_rates(tokens_path, num_tokens // (SEQ + 1), batches, loader_rounds, work)
        )
        mosaic_name = "MosaicML streaming (MDS, local)"
        mosaic_spread = mosaic_raw = None
        if "error" not in mosaic:
            mosaic_spread = Spread.of(mosaic["mds"])
            mosaic_raw = Spread.of(mosaic["raw"])
            normalised[mosaic_name] = mosaic_spread.median / mosaic_raw.median
        best = max(normalised.values()) if normalised else None
        lines += [
            f"### DataLoader\n\n`DataLoader(batch_size=8, num_workers=2, shuffle=True)` on the same tokens, samples/s "
            f"over {batches} batches after start-up and {WARMUP_BATCHES} warm-up batches, variants interleaved "
            f"round by round, median (min-max) of {loader_rounds} rounds. Target: tokenloom >= 1.00x raw and >= 1.2x "
            "the best peer.",
            "",
            "| dataset | samples/s | vs raw | vs best peer | note |",
            "|---|---:|---:|---:|---|",
        ]
        for name, spread in rates.items():
            ratio = spread.median / base
            vs_peer = f"{ratio / best:.2f}x" if best else "-"
            lines.append(f"| {name} | {spread.cell()} | {ratio:.2f}x | {vs_peer} | {notes.get(name, '')} |")
        for name, note in notes.items():
            if name not in rates:
                lines.append(f"| {name} | - | | | {note} |")
        if mosaic_spread is None or mosaic_raw is None:
            lines.append(f"| {mosaic_name} | - | | | not measured: {mosaic.get('error')} |")
        else:
            ratio = normalised[mosaic_name]
            lines.append(
                f"| {mosaic_name} | {mosaic_spread.cell()} | {ratio:.2f}x | {ratio / best:.2f}x | "  # type: ignore[operator]
                f"streaming {mosaic['version']} in an isolated venv; vs its own raw A/B run there "
                f"({mosaic_raw.cell()}); MDS write {mosaic['setup_s']:.1f} s |"
            )
        lines.append("")

        # 3. worker memory as the data grows
        log("3. worker memory as the data grows")
        memory_rows = []
        for size_gb in rss_sizes_gb:
            big = work / f"sparse{size_gb}"
            write_native(big, size_gb * (1 << 30) // 2, random_tokens=False)
            memory_rows.append((size_gb, *memory_in_fresh_process(big, memory_runs)))
            shutil.rmtree(big)
        first_anon, first_rss = memory_rows[0][1], memory_rows[0][2]
        lines += [
            "### Worker memory as the data grows\n\nNative uint16 shards of 1024-token entries (sparse files, so "
            "20 GB is free; the entry index is real: 10^7 entries at 20 GB), opened by path; a "
            "`DataLoader(batch_size=8, num_workers=2, collate_fn=collate)` worker (fork) after 200 random batches, "
            f"median of the 2 workers and of {memory_runs} run(s), each size in a fresh process (so the parent the "
            "workers fork from is the same for every size). RssAnon is the worker's anonymous memory (with fork it "
            "includes pages shared with the parent, so Pss_Anon is shown too), VmRSS adds the file pages it "
            "touched. Target: flat within 10%.",
            "",
            "| data | entries | worker RssAnon MiB | vs 1 GB | worker VmRSS MiB | vs 1 GB | Pss_Anon MiB "
            "| pickled dataset |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
            *[
                f"| {size} GB | {entries:,} | {anon:.0f} | {anon / first_anon:.2f}x | {rss:.0f} | "
                f"{rss / first_rss:.2f}x | {pss:.0f} | {pickled:,} B |"
                for size, anon, rss, pss, pickled, entries in memory_rows
            ],
            "",
        ]

        # 4. time to first sample
        log("4. time to first sample")
        first_root = work / "billion"
        write_native(first_root, 1_000_000_000, doc_len=1000, random_tokens=False)
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            first = MemoryMappedDataset(first_root, SEQ, pack_sequences=True, eos_id=0)
            first[len(first) // 2]
            times.append(time.perf_counter() - start)
        lines += [
            "### Time to first sample\n\n10^9-token native dataset (sparse, manifest, 10^6 entries): "
            "`MemoryMappedDataset(path, 2048, pack_sequences=True)` (opens and validates the manifest and index) "
            f"plus one packed sample, no prebuilt cache: {Spread.of([t * 1000 for t in times]).cell(1)} ms, "
            f"median (min-max) of {REPEATS}. Target: well under 1 s.",
            "",
        ]

    # 5. packing plans
    log("5. packing plans")
    rng = np.random.default_rng(1)
    lengths = np.clip(rng.lognormal(mean=6.0, sigma=1.1, size=plan_docs).astype(np.int64) + 1, 1, 2048)
    plans = plan_seconds(lengths, 2048)
    lines += [
        f"### Packing plans\n\n{plan_docs:,} documents, log-normal lengths (median ~400 tokens, clipped to "
        f"[1, 2048]) into 2048-token sequences, median (min-max) of {REPEATS}. Target: 10^7 documents in seconds, "
        "best-fit padding < 1%.",
        "",
        "| algorithm | seconds | padding |",
        "|---|---:|---:|",
        *[f"| {name} | {spread.cell(2)} | {waste:.3%} |" for name, (spread, waste) in plans.items()],
        "",
    ]

    # 6. mixture schedule
    log("6. mixture schedule")
    mixture_samples = 100_000 if quick else 10_000_000
    weights = np.array([0.5, 0.3, 0.2])
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        interleave(weights, mixture_samples)
        times.append(time.perf_counter() - start)
    spread = Spread.of(times)
    lines += [
        f"### Mixture schedule\n\n`MixtureDataset` stores no order: each position's source comes from "
        "tokenloom.sampler's `MixSchedule` on demand (O(1) per position, vectorised in `__getitems__`). "
        f"The source of every one of {mixture_samples:,} positions over 3 sources at once (`interleave`) "
        f"takes {spread.cell(2)} s ({mixture_samples / spread.median / 1e6:,.1f} M positions/s), "
        f"median (min-max) of {REPEATS}. No target in issue 5.",
        "",
        f"Command: `uv run --group bench python tools/bench/bench_datasets.py{' --quick' if quick else ''}`; "
        f"machine: {os.cpu_count()} cores; torch {torch.__version__}.",
    ]
    text = "\n".join(lines) + "\n"
    if not quick:  # a smoke run must not replace the published figures
        out = REPO / "docs" / "benchmarks" / "datasets.md"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return text


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--memory", type=Path, help=argparse.SUPPRESS)  # one worker-memory measurement
    parser.add_argument("--runs", type=int, default=REPEATS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory is not None:
        memory_main(args.memory, args.runs)
        raise SystemExit(0)
    started = time.perf_counter()
    sys.stdout.write(run(args.quick))
    sys.stderr.write(f"took {time.perf_counter() - started:.0f} s\n")
