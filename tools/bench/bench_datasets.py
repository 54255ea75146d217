"""tokenloom-datasets benchmark: window reads, DataLoader throughput, worker RSS, time to first sample.

    uv run --group bench python tools/bench/bench_datasets.py [--quick]

``run(quick)`` returns the markdown section and writes docs/benchmarks/datasets.md.
Peers (litdata, megatron-core) are measured when the ``bench`` group is
installed; a peer that fails to install or run is reported with its error.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from tokenloom.datasets import MemoryMappedDataset, collate
from tokenloom.formats import Manifest, Shard, TokenDataset, describe_files, open_dataset, write_manifest

REPO = Path(__file__).resolve().parents[2]
SEQ = 2048
REPEATS = 3


def median_rate(fn: Callable[[], int], repeats: int = REPEATS) -> float:
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        count = fn()
        rates.append(count / (time.perf_counter() - start))
    return statistics.median(rates)


def write_native_sparse(root: Path, num_tokens: int, doc_len: int = 1024, *, random_tokens: bool) -> None:
    """A native dataset of ``num_tokens`` uint16 tokens: random data, or a sparse (all-zero) file."""
    root.mkdir(parents=True, exist_ok=True)
    data = root / "shard_00000.bin"
    if random_tokens:
        rng = np.random.default_rng(0)
        with open(data, "wb") as handle:
            for start in range(0, num_tokens, 1 << 24):
                handle.write(rng.integers(0, 50000, min(1 << 24, num_tokens - start), dtype=np.uint16).tobytes())
    else:
        with open(data, "wb") as handle:
            handle.truncate(num_tokens * 2)
    count = -(-num_tokens // doc_len)
    offsets = np.minimum(np.arange(count + 1, dtype=np.int64) * doc_len, num_tokens)
    header = struct.pack("<4sHHQ", b"GPTS", 1, 2, count)
    (root / "shard_00000.idx").write_bytes(header + offsets.astype("<i8").tobytes() + np.zeros(count, "<u2").tobytes())
    files = describe_files(root, [("shard_00000.idx", "index"), ("shard_00000.bin", "data")])
    write_manifest(
        root,
        Manifest(
            format="native", dtype="uint16", num_tokens=num_tokens, num_documents=count, files=files, vocab_size=50000
        ),
    )


def sparse_dataset(root: Path, num_tokens: int) -> TokenDataset:
    """A one-shard TokenDataset over a sparse file (no manifest: checksumming 20 GB of holes is not the point)."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "tokens.bin"
    with open(path, "wb") as handle:
        handle.truncate(num_tokens * 2)
    shard = Shard(
        tokens_path=path,
        dtype=np.dtype("uint16"),
        num_tokens=num_tokens,
        offsets=np.array([0, num_tokens], dtype=np.int64),
        overlap_prefix=np.zeros(1, np.uint16),
        name="tokens",
    )
    return TokenDataset([shard], format="native", root=root)


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


def bench_getitem(ds: MemoryMappedDataset, raw: RawWindows, count: int) -> tuple[float, float]:
    order = np.random.default_rng(1).integers(0, len(ds), count).tolist()
    for i in order[:2000]:  # warm the page cache
        ds[i]
        raw[i]

    def run_raw() -> int:
        for i in order:
            raw[i]
        return count

    def run_ours() -> int:
        for i in order:
            ds[i]
        return count

    return median_rate(run_raw), median_rate(run_ours)


def loader_rate(dataset: Dataset, batches: int, **kwargs) -> float:
    return steady_rate(lambda: DataLoader(dataset, batch_size=8, num_workers=2, shuffle=True, **kwargs), batches)


def steady_rate(make_loader: Callable[[], Any], batches: int) -> float:
    """Samples/s from the first batch to the last (worker start-up excluded, it differs by start method)."""
    rates = []
    for _ in range(REPEATS):
        iterator = iter(make_loader())
        next(iterator)
        start = time.perf_counter()
        seen = 0
        for _ in range(batches):
            batch = next(iterator)
            seen += len(batch["input_ids"]) if isinstance(batch, dict) else len(batch)
        rates.append(seen / (time.perf_counter() - start))
        del iterator
    return statistics.median(rates)


def litdata_rate(root: Path, num_tokens: int, batches: int) -> float:
    import litdata
    from litdata.streaming.item_loader import TokensLoader

    out = root.parent / "litdata"
    pieces = list(range(0, num_tokens, 1 << 22))
    litdata.optimize(
        fn=functools.partial(_litdata_piece, str(root / "shard_00000.bin")),
        inputs=pieces,
        output_dir=str(out),
        chunk_size=(SEQ + 1) * 512,
        item_loader=TokensLoader(),
        num_workers=1,
        mode="overwrite",
    )
    dataset = litdata.StreamingDataset(str(out), item_loader=TokensLoader(block_size=SEQ + 1), shuffle=True)

    return steady_rate(lambda: litdata.StreamingDataLoader(dataset, batch_size=8, num_workers=2), batches)


def _litdata_piece(path: str, start: int):
    tokens = np.memmap(path, dtype=np.uint16, mode="r")
    yield torch.from_numpy(np.asarray(tokens[start : start + (1 << 22)], dtype=np.int64))


class _MegatronTokenizer:
    eod = 0
    pad = 1
    vocab_size = 50000
    unique_identifiers = {"class": "bench"}  # noqa: RUF012


def _megatron_collate(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.stack([sample[key] for sample in batch]) for key in ("tokens", "labels")} | {
        "input_ids": torch.stack([sample["tokens"] for sample in batch])
    }


def megatron_rate(root: Path, num_tokens: int, batches: int) -> float:
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
    from megatron.core.datasets.utils import Split

    prefix = str(root.parent / "megatron" / "data")
    Path(prefix).parent.mkdir(exist_ok=True)
    tokens = np.memmap(root / "shard_00000.bin", dtype=np.uint16, mode="r")
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
        path_to_cache=str(root.parent / "megatron-cache"),
        mid_level_dataset_surplus=0.005,
    )
    count = num_tokens // (SEQ + 1)
    dataset = GPTDataset(indexed, prefix, np.arange(len(indexed.sequence_lengths)), count, Split.train, config)
    return loader_rate(dataset, batches, collate_fn=_megatron_collate)


def worker_rss(ds: Dataset, batches: int) -> tuple[float, float]:
    """(RssAnon, VmRSS) of a DataLoader worker after ``batches`` random batches, MiB (median of the 2 workers)."""
    loader = DataLoader(ds, batch_size=8, num_workers=2, shuffle=True, collate_fn=collate)
    iterator = iter(loader)
    for _ in range(batches):
        next(iterator)
    anon, total = [], []
    for worker in iterator._workers:  # type: ignore[attr-defined]
        fields = dict(
            line.split(":", 1) for line in Path(f"/proc/{worker.pid}/status").read_text().splitlines() if ":" in line
        )
        anon.append(int(fields["RssAnon"].split()[0]) / 1024)
        total.append(int(fields["VmRSS"].split()[0]) / 1024)
    del iterator
    return statistics.median(anon), statistics.median(total)


def run(quick: bool) -> str:
    num_tokens = 20_000_000 if quick else 200_000_000
    getitem_count = 20_000 if quick else 100_000
    batches = 300 if quick else 1500
    rss_sizes_gb = [1, 4] if quick else [1, 20]
    lines = ["## tokenloom-datasets", ""]
    with tempfile.TemporaryDirectory(prefix="bench-datasets-") as tmp:
        root = Path(tmp) / "native"
        write_native_sparse(root, num_tokens, random_tokens=True)
        ds = MemoryMappedDataset(root, SEQ)
        raw = RawWindows(root / "shard_00000.bin", num_tokens)
        raw_rate, our_rate = bench_getitem(ds, raw, getitem_count)
        lines += [
            f"Random `__getitem__` of {SEQ}-token windows, uint16 shard of {num_tokens / 1e6:.0f} M tokens, "
            f"warm page cache, 1 process ({getitem_count} reads, median of {REPEATS}):",
            "",
            "| reader | windows/s | vs raw |",
            "|---|---:|---:|",
            f"| raw numpy memmap + int64 + torch.from_numpy | {raw_rate:,.0f} | 1.00x |",
            f"| tokenloom MemoryMappedDataset | {our_rate:,.0f} | {our_rate / raw_rate:.2f}x |",
            "",
        ]
        rows = [("raw numpy per-sample dataset", loader_rate(raw, batches))]
        rows.append(("tokenloom, default_collate", loader_rate(ds, batches)))
        rows.append(("tokenloom, `collate` (batched `__getitems__`)", loader_rate(ds, batches, collate_fn=collate)))
        peers: list[tuple[str, float | str]] = []
        for name, fn in (
            ("litdata TokensLoader StreamingDataset", litdata_rate),
            ("megatron-core GPTDataset", megatron_rate),
        ):
            try:
                peers.append((name, fn(root, num_tokens, batches)))
            except Exception as exc:  # a peer that does not install or run is reported, not fatal
                peers.append((name, f"not measured: {type(exc).__name__}: {str(exc)[:120]}"))
        peers.append(("MosaicML streaming (MDS)", "not measured: its pins would downgrade numpy/transformers/hub"))
        base = rows[0][1]
        measured_peers = [rate for _, rate in peers if isinstance(rate, float)]
        best_peer = max(measured_peers) if measured_peers else None
        lines += [
            f"`DataLoader(batch_size=8, num_workers=2, shuffle=True)`, {batches} batches, median of {REPEATS}:",
            "",
            "| dataset | samples/s | vs raw | vs best peer |",
            "|---|---:|---:|---:|",
        ]
        for name, rate in rows + peers:
            if isinstance(rate, float):
                vs_peer = f"{rate / best_peer:.2f}x" if best_peer else "-"
                lines.append(f"| {name} | {rate:,.0f} | {rate / base:.2f}x | {vs_peer} |")
            else:
                lines.append(f"| {name} | {rate} | | |")
        lines.append("")

        rss_rows = []
        for size_gb in rss_sizes_gb:
            big = sparse_dataset(Path(tmp) / f"sparse{size_gb}", size_gb * (1 << 30) // 2)
            anon, total = worker_rss(MemoryMappedDataset(big, SEQ), batches=200)
            rss_rows.append((size_gb, anon, total))
        lines += [
            "Worker memory after 200 random batches (sparse uint16 shards; RssAnon is the worker's private "
            "memory, VmRSS adds the shared page-cache pages it touched):",
            "",
            "| data | worker RssAnon MiB | worker VmRSS MiB |",
            "|---:|---:|---:|",
            *[f"| {size} GB | {anon:.0f} | {total:.0f} |" for size, anon, total in rss_rows],
            "",
        ]

        first_root = Path(tmp) / "billion"
        write_native_sparse(first_root, 1_000_000_000, random_tokens=False)
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            first = MemoryMappedDataset(open_dataset(first_root), SEQ, pack_sequences=True, eos_id=0)
            first[len(first) // 2]
            times.append(time.perf_counter() - start)
        lines += [
            f"Time to first sample on a 10^9-token native dataset (sparse file, manifest, ~10^6 entries, "
            f"open_dataset + MemoryMappedDataset + one packed sample, no prebuilt cache): "
            f"{statistics.median(times) * 1000:.0f} ms (median of {REPEATS}).",
            "",
            f"Command: `uv run --group bench python tools/bench/bench_datasets.py{' --quick' if quick else ''}`; "
            f"machine: {os.cpu_count()} cores.",
        ]
    text = "\n".join(lines) + "\n"
    out = REPO / "docs" / "benchmarks" / "datasets.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    sys.stdout.write(run(parser.parse_args().quick))
