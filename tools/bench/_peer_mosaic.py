# pyright: reportMissingImports=false
# (streaming lives only in the MosaicML venv this script runs in: _mosaic_env.py)
"""MosaicML streaming (MDS, local) through a DataLoader, with its own raw per-sample baseline.

Runs in the MosaicML venv of _mosaic_env.py, never the workspace (its pins would downgrade
numpy / transformers / huggingface-hub for every package); PYTHON is that venv's python
(``_mosaic_env.mosaic_python()``, which makes the venv if needed):

    PYTHON tools/bench/_peer_mosaic.py --tokens PATH --count N --batches B --repeats R --work DIR

Writes the windows of the uint16 token file PATH as MDS (``ndarray:uint16:L+1``
column), then alternates raw / MDS loaders (A/B per round, warm-up excluded)
and prints one JSON line: setup seconds and both rates per round.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from streaming import MDSWriter, StreamingDataset
from streaming.base.util import clean_stale_shared_memory
from torch.utils.data import DataLoader, Dataset

SEQ = 2048
WARMUP = 20


class RawWindows(Dataset):
    def __init__(self, path: str, count: int) -> None:
        self.path, self.count, self.tokens = path, count, None

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self.tokens is None:
            self.tokens = np.memmap(self.path, dtype=np.uint16, mode="r")
        window = torch.from_numpy(self.tokens[index * (SEQ + 1) : (index + 1) * (SEQ + 1)].astype(np.int64))
        return {"input_ids": window[:-1], "labels": window[1:]}


class MdsWindows(StreamingDataset):
    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        window = torch.from_numpy(super().__getitem__(index)["tokens"].astype(np.int64))
        return {"input_ids": window[:-1], "labels": window[1:]}


def rate(make, batches: int) -> float:
    iterator = iter(make())
    for _ in range(WARMUP):
        next(iterator)
    start, seen = time.perf_counter(), 0
    for _ in range(batches):
        seen += len(next(iterator)["input_ids"])
    elapsed = time.perf_counter() - start
    del iterator
    return seen / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--batches", type=int, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    clean_stale_shared_memory()
    out = Path(args.work) / "mds"
    start = time.perf_counter()
    tokens = np.memmap(args.tokens, dtype=np.uint16, mode="r")
    with MDSWriter(out=str(out), columns={"tokens": f"ndarray:uint16:{SEQ + 1}"}, size_limit=1 << 26) as writer:
        for index in range(args.count):
            writer.write({"tokens": np.asarray(tokens[index * (SEQ + 1) : (index + 1) * (SEQ + 1)])})
    setup = time.perf_counter() - start
    raw = RawWindows(args.tokens, args.count)
    rates: dict[str, list[float]] = {"raw": [], "mds": []}
    for _ in range(args.repeats):
        rates["raw"].append(rate(lambda: DataLoader(raw, batch_size=8, num_workers=2, shuffle=True), args.batches))

        def make_mds() -> DataLoader:
            dataset = MdsWindows(local=str(out), shuffle=True, batch_size=8)
            return DataLoader(dataset, batch_size=8, num_workers=2)

        rates["mds"].append(rate(make_mds, args.batches))
        clean_stale_shared_memory()
    import streaming

    print(json.dumps({"setup_s": setup, "version": streaming.__version__, **rates}))


if __name__ == "__main__":
    main()
