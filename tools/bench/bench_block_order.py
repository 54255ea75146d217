"""Fetched bytes / used bytes from S3 with a bounded cache: the sampler's block order against its global order.

One native dataset on a local SeaweedFS S3 server behind the counting proxy; one node, a
``DataLoader(batch_size=8, num_workers=2)`` over ``MemoryMappedDataset`` windows of 2,049 tokens with
``dataset.prefetch(sampler, ...)``, a cache of 1 MiB blocks bounded by ``cache_limit`` (a fraction of the
data, as on a node whose disk is smaller than the corpus); one full epoch per order, each with an empty
cache. Fetched = body bytes of every ``.bin`` GET counted at the proxy; used = samples x 2,049 x 2 bytes.
The figure is a count, not a time, so the machine's load does not move it.

    uv run --group bench python tools/bench/bench_block_order.py [--quick]

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
        options = {"block_samples": BLOCK_SAMPLES, "window_blocks": WINDOW_BLOCKS} if order == "block" else {}
        sampler = ResumableDistributedSampler(ds, num_replicas=1, rank=0, seed=1, order=order, **options)
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


def measure(quick: bool) -> dict:
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
            for order in ("block", "feistel"):
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
    for order in ("block", "feistel"):
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


def run(quick: bool) -> str:
    text = report(measure(quick))
    if not quick:
        OUTPUT.write_text(text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10 M tokens: a smoke run")
    print(run(parser.parse_args().quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
