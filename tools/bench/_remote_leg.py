# pyright: reportMissingImports=false
# (streaming lives only in the MosaicML venv the mosaic leg runs in: _mosaic_env.py)
"""One contender of bench_remote_peers.py: write its format, or read it from S3 through a DataLoader.

The same script serves the three contenders so that each is measured the same way; its imports are
lazy, because the MosaicML leg runs in a venv (_mosaic_env.py) that has neither tokenloom nor litdata:

    python tools/bench/_remote_leg.py write-litdata --tokens T --count N --per-shard S --out DIR
    python tools/bench/_remote_leg.py write-mds --tokens T --count N --per-shard S --out DIR
    python tools/bench/_remote_leg.py read --leg {tokenloom,litdata,mosaic} --url s3://... \
        --endpoint URL --count N --cache DIR --passes cold,warm,...
    python tools/bench/_remote_leg.py serve --leg {tokenloom,litdata,mosaic}   # jobs as JSON lines on stdin

``serve`` imports once and forks a child per job, each doing what ``read`` does (see :func:`serve`).

``read`` runs the passes in order: "cold" starts from an empty cache directory (CACHE/cache), "warm"
rereads with what is there (bench_remote_peers.py runs one pass per process: MosaicML's
StreamingDataset stalls or reads the wrong shard files when a second one is made in the same
process). Before each pass it prints ``{"ready": PASS}`` and waits for a line on stdin (the
benchmark sets the proxy's latency and resets its counters), then reads every sample once through
``DataLoader(batch_size=8, num_workers=2)``, sums every token into an int64 accumulator (the token
sum is checked by the benchmark) and prints one JSON line: seconds, time to first batch, samples.
The clock starts before the dataset object is made (so it includes opening the index).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

SEQ = 2048
BATCH = 8
WORKERS = 2


def _samples(tokens: str, count: int):
    data = np.memmap(tokens, dtype=np.uint16, mode="r")
    for index in range(count):
        yield np.asarray(data[index * (SEQ + 1) : (index + 1) * (SEQ + 1)])


def _litdata_shard(args: tuple[str, int, int]):
    tokens, start, stop = args
    data = np.memmap(tokens, dtype=np.uint16, mode="r")
    for index in range(start, stop):
        yield np.asarray(data[index * (SEQ + 1) : (index + 1) * (SEQ + 1)])


def write_litdata(tokens: str, count: int, per_shard: int, out: str) -> None:
    import litdata
    from litdata.streaming.item_loader import TokensLoader

    litdata.optimize(
        fn=_litdata_shard,
        inputs=[(tokens, start, min(count, start + per_shard)) for start in range(0, count, per_shard)],
        output_dir=out,
        chunk_size=(SEQ + 1) * per_shard,
        item_loader=TokensLoader(),
        num_workers=1,
        mode="overwrite",
        start_method="fork",
    )


def write_mds(tokens: str, count: int, per_shard: int, out: str) -> None:
    from streaming import MDSWriter

    limit = per_shard * ((SEQ + 1) * 2 + 4) + 1024  # MDS counts each sample's bytes plus its offset
    with MDSWriter(out=out, columns={"tokens": f"ndarray:uint16:{SEQ + 1}"}, size_limit=limit) as writer:
        for sample in _samples(tokens, count):
            writer.write({"tokens": sample})


# -- readers: each returns an iterable of batches, and a function that sums one batch ---------------------


def _order(count: int, order: str):
    """tokenloom's sampler in ``order``: "block" (blocks of consecutive samples, one shard each, shuffled, then
    samples in a window of 2 blocks: the object-storage order) or "global" (a keyed permutation of every sample)."""
    from tokenloom.sampler import ResumableDistributedSampler

    if order == "global":
        return ResumableDistributedSampler(count, num_replicas=1, rank=0, seed=1)
    per_block = max(1, count // 8)
    return ResumableDistributedSampler(
        count, num_replicas=1, rank=0, seed=1, order="block", block_samples=per_block, window_blocks=2
    )


class _Plain(torch.utils.data.Dataset):
    """The physical limit: the same batches gathered from one local memory map of the tokens (no cache, no checks)."""

    def __init__(self, path: str, count: int) -> None:
        self.path, self.count, self.tokens = path, count, None

    def __len__(self) -> int:
        return self.count

    def __getitems__(self, indices):
        from tokenloom.datasets import SampleBatch

        if self.tokens is None:  # mapped in the worker
            self.tokens = np.memmap(self.path, dtype=np.uint16, mode="r")
        out = np.empty((len(indices), SEQ + 1), dtype=np.uint16)
        for row, index in enumerate(indices):
            out[row] = self.tokens[index * (SEQ + 1) : (index + 1) * (SEQ + 1)]
        return SampleBatch.from_windows(out)  # the batch tokenloom hands the loader: the same way to the parent


def _plain(url: str, endpoint: str, cache: Path, count: int, order: str = "block"):
    from tokenloom.datasets import collate

    loader = DataLoader(
        _Plain(url, count),
        batch_size=BATCH,
        num_workers=WORKERS,
        sampler=_order(count, order),
        collate_fn=collate,
        multiprocessing_context="fork",
    )
    return loader, _tokenloom_total


def _tokenloom(url: str, endpoint: str, cache: Path, count: int, order: str = "block"):
    from tokenloom.datasets import MemoryMappedDataset, collate
    from tokenloom.formats import RemoteOptions  # here: the MosaicML leg's venv has no tokenloom

    options = {
        "endpoint": endpoint,
        "access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
        "secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"],
        "region": "us-east-1",
        "client_options": {"allow_http": True},
    }
    dataset = MemoryMappedDataset(
        url, seq_len=SEQ, remote=RemoteOptions.from_keywords(storage_options=options, block_cache_dir=cache)
    )
    if len(dataset) != count:
        raise SystemExit(f"tokenloom sees {len(dataset)} samples, expected {count}")
    sampler = _order(count, order)
    loader = DataLoader(
        dataset,
        batch_size=BATCH,
        num_workers=WORKERS,
        sampler=sampler,
        collate_fn=collate,
        multiprocessing_context="fork",
    )

    return loader, _tokenloom_total


def _tokenloom_total(batch) -> tuple[int, int]:
    ids = batch["input_ids"]
    return int(ids.sum(dtype=torch.int64)) + int(batch["labels"][:, -1].sum(dtype=torch.int64)), len(ids)


def _litdata(url: str, endpoint: str, cache: Path, count: int):
    import litdata
    import litdata.streaming.downloader as downloader
    from litdata.streaming.item_loader import TokensLoader

    # litdata fetches chunks with obstore, whose client options it fixes in this module constant and which
    # refuses a plain-http endpoint unless told (real S3 is https): allow http, change nothing else
    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": "true"}

    options = {
        "endpoint_url": endpoint,
        "aws_access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"],
        "region_name": "us-east-1",
    }
    dataset = litdata.StreamingDataset(
        url,
        cache_dir=str(cache),
        item_loader=TokensLoader(block_size=SEQ + 1),
        shuffle=True,
        storage_options=options,
    )
    if len(dataset) != count:
        raise SystemExit(f"litdata sees {len(dataset)} samples, expected {count}")
    loader = litdata.StreamingDataLoader(dataset, batch_size=BATCH, num_workers=WORKERS, multiprocessing_context="fork")

    def total(batch) -> tuple[int, int]:
        return int(batch.sum(dtype=torch.int64)), len(batch)

    return loader, total


def _mosaic(url: str, endpoint: str, cache: Path, count: int):
    from streaming import StreamingDataset

    os.environ["S3_ENDPOINT_URL"] = endpoint
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    dataset = StreamingDataset(remote=url, local=str(cache), shuffle=True, batch_size=BATCH)
    if len(dataset) != count:
        raise SystemExit(f"mosaic sees {len(dataset)} samples, expected {count}")
    # The parent fetched index.json with a boto3 client that forked workers would inherit and share (one
    # keep-alive socket, interleaved responses: stalls of its 60 s timeout and shard files holding another
    # reply). Drop it before the fork, as MosaicML does itself when it pickles a downloader for spawn.
    for stream in dataset.streams:
        stream._downloader._s3_client = None
    loader = DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS, multiprocessing_context="fork")

    def total(batch) -> tuple[int, int]:
        return int(batch["tokens"].sum(dtype=torch.int64)), len(batch["tokens"])

    return loader, total


READERS = {"tokenloom": _tokenloom, "litdata": _litdata, "mosaic": _mosaic, "plain": _plain}


def _imports(leg: str) -> None:
    """The leg's imports, before any clock starts (so that no pass pays for them)."""
    if leg == "mosaic":
        import streaming.base.util  # noqa: F401
    elif leg == "litdata":
        import litdata  # noqa: F401
    else:
        import tokenloom.datasets
        import tokenloom.sampler  # noqa: F401


def read(
    leg: str,
    url: str,
    endpoint: str,
    count: int,
    cache_root: Path,
    passes: list[str],
    first_only: bool,
    options: dict | None = None,
) -> None:
    _imports(leg)
    if leg == "mosaic":
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
    cache = cache_root / "cache"
    for kind in passes:
        if kind == "cold":
            shutil.rmtree(cache, ignore_errors=True)
        print(json.dumps({"ready": kind}), flush=True)
        if not sys.stdin.readline():
            return
        started, cpu = time.perf_counter(), os.times()
        loader, total = READERS[leg](url, endpoint, cache, count, **(options or {}))
        first, samples, token_sum = None, 0, 0
        for batch in loader:
            if first is None:
                first = time.perf_counter() - started
            batch_sum, batch_samples = total(batch)
            token_sum += batch_sum
            samples += batch_samples
            if first_only:
                break
        seconds = time.perf_counter() - started
        del loader
        gc.collect()  # the workers are joined: their CPU counts in children's times
        done = os.times()
        cpu_s = sum(done[:4]) - sum(cpu[:4])  # user + system, this process and its waited-for workers
        record = {"pass": kind, "seconds": seconds, "first_batch_s": first, "samples": samples, "token_sum": token_sum}
        print(json.dumps({**record, "cpu_s": cpu_s}), flush=True)


def serve(leg: str) -> None:
    """Import once, then fork a fresh child per job read from stdin: each pass in a process that never made a dataset.

    A job is one JSON line (url, endpoint, count, cache, passes, first_only); the child speaks ``read``'s protocol
    on the same stdin/stdout, and after it ends this process prints ``{"exit": code}``. Forking from here saves
    each pass the interpreter start and imports (2-3 s each, 36 passes a run), which no pass's clock counted.
    """
    _imports(leg)
    print(json.dumps({"serving": leg}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        # (native thread pools that imports start, e.g. OpenBLAS's, are idle: every fork-started DataLoader worker
        # is forked with them too; a Python thread could hold a lock the child would then wait for forever)
        if threading.active_count() != 1:
            raise SystemExit("the server has started Python threads: forking it would not give a clean process")
        pid = os.fork()
        if pid == 0:  # the child: one job, then out without the parent's exit handlers
            code = 0
            try:
                reader = job.get("reader", leg)  # the tokenloom server also runs the plain gather
                read(
                    reader, job["url"], job["endpoint"], job["count"], Path(job["cache"]), job["passes"],
                    job["first_only"], job.get("options"),
                )  # fmt: skip
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"exit": os.waitstatus_to_exitcode(status)}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["write-litdata", "write-mds", "read", "serve"])
    parser.add_argument("--tokens")
    parser.add_argument("--count", type=int)
    parser.add_argument("--per-shard", type=int)
    parser.add_argument("--out")
    parser.add_argument("--leg", choices=sorted(READERS))
    parser.add_argument("--url")
    parser.add_argument("--endpoint")
    parser.add_argument("--cache")
    parser.add_argument("--passes", default="cold,warm")
    parser.add_argument("--first-only", action="store_true", help="stop each pass after its first batch")
    args = parser.parse_args()
    if args.mode == "write-litdata":
        write_litdata(args.tokens, args.count, args.per_shard, args.out)
    elif args.mode == "write-mds":
        write_mds(args.tokens, args.count, args.per_shard, args.out)
    elif args.mode == "serve":
        serve(args.leg)
    else:
        read(args.leg, args.url, args.endpoint, args.count, Path(args.cache), args.passes.split(","), args.first_only)


if __name__ == "__main__":
    main()
