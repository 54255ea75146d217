"""Fetched bytes / used bytes from S3 with a bounded cache: the sampler's block order against its global order.

One native dataset on a local SeaweedFS S3 server behind the counting proxy; one node, a
``DataLoader(batch_size=8, num_workers=2)`` over ``MemoryMappedDataset`` windows of 2,049 tokens with
``dataset.prefetch(sampler, ...)``, a cache of 1 MiB blocks bounded by ``cache_limit`` (a fraction of the
data, as on a node whose disk is smaller than the corpus); one full epoch per order, each with an empty
cache. Fetched = body bytes of every ``.bin`` GET counted at the proxy; used = samples x 2,049 x 2 bytes.
The figure is a count, not a time, so the machine's load does not move it.

Then the curriculum row (issue 38 item 4): three buckets of 128 MiB on the same kind of server, a 2-phase mix
that reads about 40% of them through ``CurriculumDataset`` with its schedule's prefetch, at 8 MiB cache blocks,
in block order and in the Feistel order (fetched from the node's ledger, as ``curriculum status`` shows it).

The global (feistel) order's rows are the contrast (every target here is the block order's):
they run with ``--full`` only (about 20 s and 1.4 GB through the proxy of a run here).

    uv run --group bench python tools/bench/bench_block_order.py [--quick | --full]

Writes docs/benchmarks/block_order.md (the full run) and returns its section.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tokenloom.formats import RemoteOptions

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_remote_cache import _write  # noqa: E402  (the same random native dataset)

OUTPUT = REPO / "docs" / "benchmarks" / "block_order.md"
SEQ = 2048
BATCH = 8
WORKERS = 2
BLOCK = 1 << 20
LOOKAHEAD = 128
BLOCK_SAMPLES = 4096  # 16 MiB of windows: 16 cache blocks (17 when unaligned)
WINDOW_BLOCKS = 2  # a shuffle window of 32 MiB
# the global order thrashes a bounded cache: a part of its epoch shows the ratio (4,000 samples took 63 s)
GLOBAL_SAMPLES = 2_000
# the curriculum row: 3 buckets of 32,768 windows (128 MiB each at 2,049 tokens), 8 MiB cache blocks, blocks of
# 8,192 samples (32 MiB); the 2-phase mix reads MIX_READ x the samples of one bucket per phase
MIX_SEQ = 2048
MIX_SAMPLES = 32_768
MIX_BLOCK_SAMPLES = 8_192
MIX_READ = 0.6


def _epoch(url: str, server, cache: Path, cache_limit: int, order: str, max_samples: int | None = None) -> dict:
    from torch.utils.data import DataLoader

    from tokenloom.datasets import MemoryMappedDataset, collate
    from tokenloom.formats import ConfigError, open_dataset
    from tokenloom.sampler import ResumableDistributedSampler
    from tokenloom.testing.servers import FaultProxy

    proxy = FaultProxy(server.endpoint)
    try:
        opened = open_dataset(
            url,
            remote=RemoteOptions.from_keywords(
                storage_options=server.storage_options(endpoint=proxy.url),
                block_cache_dir=cache,
                block_size=BLOCK,
                cache_limit=cache_limit,
            ),
        )
        ds = MemoryMappedDataset(opened, seq_len=SEQ)
        per_block, window = (BLOCK_SAMPLES, WINDOW_BLOCKS) if order == "block" else (None, None)
        sampler = ResumableDistributedSampler(
            ds, num_replicas=1, rank=0, seed=1, order=order, block_samples=per_block, window_blocks=window
        )
        prefetch = True
        try:
            ds.prefetch(sampler, batch_size=BATCH, lookahead=LOOKAHEAD, num_workers=WORKERS)
        except ConfigError:  # the global order's next samples touch more blocks than the limit holds
            prefetch = False
        loader = DataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=WORKERS, collate_fn=collate)
        started = time.perf_counter()
        samples = 0
        for batch in loader:
            samples += len(batch["input_ids"])
            if max_samples is not None and samples >= max_samples:
                break
        seconds = time.perf_counter() - started
        fetched = sum(n for path, n in proxy.get_bytes.items() if path.endswith(".bin"))
        gets = sum(n for path, n in proxy.gets.items() if path.endswith(".bin"))
    finally:
        proxy.close()
    return {"samples": samples, "fetched": fetched, "gets": gets, "seconds": seconds, "prefetch": prefetch}


def _mix_buckets(root: Path, samples: int, seq: int) -> None:
    """train/{a,b,c} of ``samples`` windows each (one document a bucket), val/{a,b,c} of 4."""
    import numpy as np

    from tokenloom.formats import open_writer

    rng = np.random.default_rng(0)
    for split, count in (("train", samples), ("val", 4)):
        for name in "abc":
            body = rng.integers(0, 50_000, size=count * seq + 1, dtype=np.uint16)
            with open_writer(root / split / name, dtype="uint16", eos_id=50_000, vocab_size=50_304) as writer:
                writer.add_batch(body, [len(body)])


def _mix_epoch(url: str, server, cache: Path, seq: int, samples: int, order: dict) -> dict:
    """The whole 2-phase curriculum over the 3 buckets at ``url`` (reading ~40% of each), prefetch on, no limit."""
    from torch.utils.data import DataLoader

    from tokenloom.curriculum import CurriculumConfig, CurriculumDataset
    from tokenloom.datasets import collate
    from tokenloom.sampler import ResumableDistributedSampler
    from tokenloom.testing.servers import FaultProxy

    phase = int(MIX_READ * samples) * seq
    proxy = FaultProxy(server.endpoint)
    try:
        config = CurriculumConfig.from_dict(
            {
                "path": url,
                "seq_len": seq,
                "packing": False,
                "curriculum": [
                    {"duration_tokens": phase, "mix": {"a": 0.5, "b": 0.3, "c": 0.2}},
                    {"duration_tokens": phase, "mix": {"a": 0.1, "b": 0.3, "c": 0.6}},
                ],
                "storage_options": server.storage_options(endpoint=proxy.url),
                "block_cache_dir": str(cache),
                **order,
            }
        )
        ds = CurriculumDataset(config, seed=1)
        sampler = ResumableDistributedSampler(ds, shuffle=False, seed=0)
        ds.prefetch(sampler, batch_size=16, lookahead=64, num_workers=WORKERS)  # the schedule's next blocks
        loader = DataLoader(ds, batch_size=16, sampler=sampler, num_workers=WORKERS, collate_fn=collate)
        started = time.perf_counter()
        count = sum(len(batch["input_ids"]) for batch in loader)
        seconds = time.perf_counter() - started
        proxy.wait_idle()
        figures = ds.fetch_figures(count)  # the node's ledger, as `tokenloom curriculum status` shows it
        wire = sum(n for path, n in proxy.get_bytes.items() if path.endswith(".bin"))
    finally:
        proxy.close()
    return {"samples": count, "seconds": seconds, "wire": wire, **figures}


def measure_mix(quick: bool, full: bool = False) -> dict:
    """A 3-bucket curriculum from S3 at 8 MiB cache blocks (quick: 8 KiB, sizes / 1024): block order vs feistel."""
    import os

    from tokenloom.testing.servers import SeaweedS3

    # quick: the same shape / 1024 (windows of 256 bytes, blocks of 128 of them = 4 cache blocks of 8 KiB)
    sizes = (MIX_SEQ, MIX_SAMPLES, 8 << 20, MIX_BLOCK_SAMPLES)
    seq, samples, block, per_block = (127, 6_144, 8 << 10, 128) if quick else sizes
    order = {"order": "block", "block_samples": per_block, "window_blocks": 1}
    out: dict = {"seq": seq, "samples": samples, "block_size": block, "order": order, "load": os.getloadavg()}
    saved = os.environ.get("TOKENLOOM_BLOCK_SIZE")
    os.environ["TOKENLOOM_BLOCK_SIZE"] = str(block)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        _mix_buckets(tmp / "local", samples, seq)
        out["data_bytes"] = sum(p.stat().st_size for p in (tmp / "local" / "train").rglob("*.bin"))
        server = SeaweedS3(tmp / "seaweed")
        try:
            prefix = f"mix-{uuid.uuid4().hex[:8]}"
            for folder in sorted({p.parent for p in (tmp / "local").rglob("*") if p.is_file()}):
                server.upload_dir(folder, f"{prefix}/{folder.relative_to(tmp / 'local').as_posix()}")
            url = f"s3://{server.bucket}/{prefix}"
            for name, options in (("block", order), ("feistel", {})) if full else (("block", order),):
                out[name] = _mix_epoch(url, server, tmp / f"cache-{name}", seq, samples, options)
        finally:
            server.stop()
            if saved is None:
                os.environ.pop("TOKENLOOM_BLOCK_SIZE", None)
            else:
                os.environ["TOKENLOOM_BLOCK_SIZE"] = saved
    return out


def report_mix(m: dict) -> str:
    mib = 1 << 20
    block = m["block_size"]
    size = f"{block // mib} MiB" if block >= mib else f"{block >> 10} KiB"
    lines = [
        "",
        f"### A 3-bucket curriculum from S3 at {size} cache blocks: fetched / used per order",
        "",
        f"3 buckets of {m['samples']:,} windows of {m['seq'] + 1:,} uint16 tokens ({m['data_bytes'] / mib:,.0f} MiB "
        "together) on the same kind of server; a 2-phase curriculum (mixes 0.5/0.3/0.2 then 0.1/0.3/0.6) that reads "
        f"about {MIX_READ * 2 / 3:.0%} of the samples; `CurriculumDataset.prefetch` (the schedule's next blocks), "
        f"`DataLoader(batch_size=16, num_workers={WORKERS})`, no cache limit, an empty cache per order. Block order: "
        f"`block_samples={m['order']['block_samples']}`, `window_blocks=1`. Fetched: the node's ledger "
        "(`CurriculumDataset.fetch_figures`, what `tokenloom curriculum status` prints; equal to the `.bin` GET bodies "
        "at the proxy); used: samples x window bytes.",
        "",
        "| order | samples | fetched MiB | used MiB | fetched / used | .bin at the proxy MiB | s | target |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name in [n for n in ("block", "feistel") if n in m]:
        r = m[name]
        ratio = r["fetched_bytes"] / r["used_bytes"]
        target = ("<= 1.5: " + ("met" if ratio <= 1.5 else "MISSED")) if name == "block" else "(the default order)"
        lines.append(
            f"| `{name}` | {r['samples']:,} | {r['fetched_bytes'] / mib:,.1f} | {r['used_bytes'] / mib:,.1f} | "
            f"{ratio:.2f} | {r['wire'] / mib:,.1f} | {r['seconds']:.1f} | {target} |"
        )
    lines.append(f"\nLoad average (1/5/15 min) at the start: {'/'.join(f'{x:.1f}' for x in m['load'])}.")
    lines.append(
        "\nWhat block order still fetches beyond what it uses: a block of samples rarely ends on a cache block (the "
        "window's one-token overlap reaches 2 bytes into the next block), and the last block each bucket reads is only "
        "partly drawn (its draws are shuffled over all of it)."
    )
    return "\n".join(lines) + "\n"


def measure(quick: bool, full: bool = False) -> dict:
    from tokenloom.testing.servers import SeaweedS3

    tokens = 10_000_000 if quick else 100_000_000
    out: dict = {"tokens": tokens}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        local = _write(tmp / "local", tokens)
        data_bytes = sum(p.stat().st_size for p in local.glob("*.bin"))
        out["data_bytes"] = data_bytes
        out["cache_limit"] = cache_limit = max(96 << 20, data_bytes // 2)
        server = SeaweedS3(tmp / "seaweed")
        try:
            url = server.upload_dir(local, f"bench-{uuid.uuid4().hex[:8]}")
            for order in ("block", "feistel") if full else ("block",):
                limit = None if order == "block" else GLOBAL_SAMPLES
                out[order] = _epoch(url, server, tmp / f"cache-{order}", cache_limit, order, limit)
        finally:
            server.stop()
    return out


def report(m: dict) -> str:
    mib = 1 << 20
    lines = [
        "## fetched bytes / used bytes from S3 with a bounded cache: block order vs the global (feistel) order",
        "",
        f"Command: `uv run --group bench python tools/bench/bench_block_order.py`. {m['tokens'] / 1e6:.0f} M uint16 "
        f"tokens ({m['data_bytes'] / mib:.0f} MiB) on a local SeaweedFS S3 server behind the counting proxy; one node, "
        f"`DataLoader(batch_size={BATCH}, num_workers={WORKERS})` over `MemoryMappedDataset` windows of {SEQ + 1:,} "
        f"tokens with `prefetch(lookahead={LOOKAHEAD})`; cache blocks of {BLOCK // mib} MiB, `cache_limit` "
        f"{m['cache_limit'] / mib:.0f} MiB ({m['cache_limit'] / m['data_bytes']:.0%} of the data); "
        f"one full epoch of the block order, the first {GLOBAL_SAMPLES:,} samples of the global order, "
        "each from an empty cache. "
        f'`order="block"` with `block_samples={BLOCK_SAMPLES}`, `window_blocks={WINDOW_BLOCKS}` '
        f"({BLOCK_SAMPLES * (SEQ + 1) * 2 * WINDOW_BLOCKS / mib:.0f} MiB windows). Fetched = `.bin` GET body bytes "
        "counted at the proxy; used = samples x 2,049 x 2 bytes. A count, not a time: load does not move it.",
        "",
        "| order | prefetch | samples | fetched MiB | used MiB | fetched / used | `.bin` GETs | epoch s | target |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for order in [o for o in ("block", "feistel") if o in m]:
        r = m[order]
        used = r["samples"] * (SEQ + 1) * 2
        ratio = r["fetched"] / used
        prefetched = "yes" if r["prefetch"] else "no (its lookahead needs more than the limit)"
        target = (
            ("<= 1.1: " + ("met" if ratio <= 1.1 else "MISSED"))
            if order == "block"
            else "(reported: the global keyed order, the default)"
        )
        lines.append(
            f"| `{order}` | {prefetched} | {r['samples']:,} | {r['fetched'] / mib:,.1f} | {used / mib:,.1f} | "
            f"{ratio:.2f} | {r['gets']:,} | {r['seconds']:.1f} | {target} |"
        )
    return "\n".join(lines) + "\n"


def run(quick: bool, full: bool = False) -> str:
    text = report(measure(quick, full)) + report_mix(measure_mix(quick, full))
    if not full:
        text += "\nThe global (feistel) order's rows, the contrast (no target), run with `--full`.\n"
    if not quick:
        OUTPUT.write_text(text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10 M tokens: a smoke run")
    parser.add_argument("--full", action="store_true", help="add the global (feistel) order's rows (the contrast)")
    args = parser.parse_args()
    print(run(args.quick, args.full))
    return 0


if __name__ == "__main__":
    sys.exit(main())
