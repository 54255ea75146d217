"""Benchmark tokenloom-eval-broadcast: 10^8 uint16 tokens to 2 gloo ranks vs a raw ``dist.broadcast``.

Two spawned processes form a gloo group on this host. Per round, interleaved:

- raw: ``dist.broadcast`` of one uint8 tensor of the same bytes (tokens x 2), receive buffer preallocated;
- tokenloom: ``broadcast_eval_set`` of the same tokens as rows of 2000 (header, 64 MiB chunks, xxh3
  checksum streamed on the receiver, range check on the source, final agreement);
- the seed's way (KempnerForge): a row count, then the rows as one int64 tensor (4x the bytes).

Each time is the slower rank's wall time (all_reduce max), after a barrier. Bytes sent counts what
the source hands to ``broadcast`` (rows, header and messages). Median (min-max) of 3 rounds;
``--quick`` uses 10^7 tokens and 1 round and does not write docs/. Target: tokenloom >= 0.5x raw.

    uv run python tools/bench/bench_eval_broadcast.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
OUTPUT = REPO / "docs" / "benchmarks" / "eval_broadcast.md"
RUNS = 3
ROW = 2000  # 10^8 tokens = 50,000 rows exactly


def _rank(rank: int, init: str, out: str, num_tokens: int, rounds: int) -> None:
    import datetime

    import numpy as np
    import torch
    import torch.distributed as dist

    import tokenloom.eval_broadcast._broadcast as broadcast_module
    from tokenloom.eval_broadcast import broadcast_eval_set

    dist.init_process_group(
        "gloo", init_method=f"file://{init}", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=300)
    )
    sent = {"bytes": 0}
    original = broadcast_module._Channel.broadcast

    def counting(self: Any, tensor: torch.Tensor, what: str) -> None:
        if self.rank == 0:
            sent["bytes"] += tensor.numel() * tensor.element_size()
        original(self, tensor, what)

    broadcast_module._Channel.broadcast = counting  # type: ignore[method-assign]
    tokens = (np.arange(num_tokens, dtype=np.uint32) % 50_257).astype(np.uint16) if rank == 0 else None

    def timed(call: Any) -> float:
        dist.barrier()
        start = time.perf_counter()
        call()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        return float(elapsed)

    def raw() -> None:
        payload = (
            torch.from_numpy(tokens.view(np.uint8))
            if tokens is not None
            else torch.empty(2 * num_tokens, dtype=torch.uint8)
        )
        dist.broadcast(payload, src=0)

    def ours() -> None:
        sent["bytes"] = 0
        broadcast_eval_set(lambda: tokens, seq_len=ROW - 1, vocab_size=50_257, timeout=300)

    def seed() -> None:
        count = torch.tensor([num_tokens // ROW if tokens is not None else 0])
        dist.broadcast(count, src=0)
        if tokens is not None:
            packed = torch.from_numpy(tokens.reshape(-1, ROW).astype(np.int64))
        else:
            packed = torch.empty(int(count), ROW, dtype=torch.long)
        dist.broadcast(packed, src=0)

    timings: dict[str, list[float]] = {"raw": [], "tokenloom": [], "seed": []}
    ours()  # warm-up: connections, lazy imports
    for _ in range(rounds):
        for name, call in (("raw", raw), ("tokenloom", ours), ("seed", seed)):
            timings[name].append(timed(call))
    if rank == 0:
        Path(out).write_text(json.dumps({"timings": timings, "sent": sent["bytes"]}))
    dist.barrier()
    dist.destroy_process_group()


def _measure(num_tokens: int, rounds: int) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result.json")
        processes = [
            context.Process(target=_rank, args=(rank, str(Path(tmp) / "init"), out, num_tokens, rounds))
            for rank in range(2)
        ]
        for process in processes:
            process.start()
        for process in processes:
            process.join(600)
            if process.is_alive():
                process.kill()
                raise RuntimeError("a benchmark rank did not finish within 600 s")
        if any(p.exitcode for p in processes):
            raise RuntimeError(f"benchmark ranks exited with {[p.exitcode for p in processes]}")
        return json.loads(Path(out).read_text())


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def run(quick: bool) -> str:
    """Run the benchmark; return it as markdown (the full run is what docs/ quotes)."""
    num_tokens = 10**7 if quick else 10**8
    rounds = 1 if quick else RUNS
    result = _measure(num_tokens, rounds)
    timings, sent = result["timings"], result["sent"]
    raw = statistics.median(timings["raw"])
    payload = {"raw": 2 * num_tokens, "tokenloom": sent, "seed": 8 * num_tokens + 8}
    lines = [
        "### tokenloom-eval-broadcast",
        "",
        f"{num_tokens:,} uint16 tokens (rows of {ROW}) from rank 0 to rank 1, 2 gloo processes on one host; "
        f"seconds of the slower rank, median (min-max) of {rounds} interleaved round(s). "
        "Target: tokenloom >= 0.5x the raw broadcast; bytes = tokens x 2.",
        "",
        "| transfer | seconds | GB/s of tokens x 2 | vs raw | bytes sent by rank 0 | bytes / token |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    names = {
        "raw": "raw `dist.broadcast` of one uint8 tensor",
        "tokenloom": "tokenloom `broadcast_eval_set` (header, 64 MiB chunks, checksum)",
        "seed": "seed (KempnerForge): row count + int64 rows",
    }
    for key in ("raw", "tokenloom", "seed"):
        median = statistics.median(timings[key])
        lines.append(
            f"| {names[key]} | {_fmt(timings[key])} | {2 * num_tokens / median / 1e9:.2f} | "
            f"{raw / median:.2f}x | {payload[key]:,} | {payload[key] / num_tokens:.2f} |"
        )
    overhead = sent - 2 * num_tokens
    lines += [
        "",
        f"tokenloom's bytes beyond the tokens: {overhead:,} (the 96-byte header; the settings check and the "
        "checksum agreement are two small all_reduces, not counted).",
        "",
        "Command: `uv run python tools/bench/bench_eval_broadcast.py`.",
        "",
    ]
    markdown = "\n".join(lines)
    if not quick:  # the full run is what docs/ and the README quote
        OUTPUT.parent.mkdir(parents=True, exist_ok=True)
        OUTPUT.write_text(markdown)
    return markdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10^7 tokens, 1 round; does not write docs/")
    args = parser.parse_args()
    print(run(args.quick))
    if not args.quick:
        print(f"written to {OUTPUT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
