"""Eval-broadcast under torchrun: one good broadcast, then a build that fails on rank 0.

Good: rank 0 builds the eval set from a token dataset on disk (PathEvalSource), every
rank receives it, scores its exact share with a fixed function (-log of a fixed
distribution over ids) and all-reduces a token-weighted mean. Bad: rank 0's build raises
(the path does not exist); every rank must get EvalBuildError with rank 0's message.
Each rank writes ``OUT/rank<r>.json`` and then exits with the error (exit code 1).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

import numpy as np
import orjson
import torch
import torch.distributed as dist

from tokenloom.eval_broadcast import EvalDataset, PathEvalSource, broadcast_eval_set, token_weighted_mean


def score(dataset: EvalDataset) -> tuple[float, int]:
    labels = dataset.batch(np.arange(len(dataset)))["labels"].numpy()
    scored = labels[labels != -100]
    return float(np.log1p(scored.astype(np.float64)).sum()), int(scored.size)  # a fixed function of the ids


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--good", required=True)
    parser.add_argument("--bad", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seq-len", type=int, default=32)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    result: dict = {"rank": rank, "world": world}
    evalset = broadcast_eval_set(PathEvalSource(args.good), seq_len=args.seq_len, timeout=30)
    loss_sum, tokens = score(EvalDataset(evalset.split(rank, world), pack_sequences=True))
    mean = token_weighted_mean(torch.tensor(loss_sum, dtype=torch.float64), torch.tensor(tokens))
    whole_sum, whole_tokens = score(EvalDataset(evalset, pack_sequences=True))
    result.update(
        digest=hashlib.sha256(evalset.numpy().tobytes()).hexdigest(),
        rows=len(evalset),
        tokens=tokens,
        loss=float(mean),
        whole_loss=whole_sum / whole_tokens,
        whole_tokens=whole_tokens,
    )
    started = time.monotonic()
    try:
        broadcast_eval_set(PathEvalSource(args.bad), seq_len=args.seq_len, timeout=30)
        result["bad"] = "no error"
    except Exception as exc:
        result["bad"] = {"type": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - started}
        Path(args.out, f"rank{rank}.json").write_bytes(orjson.dumps(result))
        raise
    Path(args.out, f"rank{rank}.json").write_bytes(orjson.dumps(result))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main())
