"""A rank of the distributed HuggingFaceDataset test (spawned by test_hf.py; not a test module)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from datasets_helpers import init_gloo


def run(rank: int, world_size: int, init_file: str, jsonl: str, tokenizer_dir: str, tmp: str) -> None:
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    os.environ["HF_DATASETS_CACHE"] = str(Path(tmp) / f"hf-datasets-rank{rank}")
    import torch.distributed as dist

    import tokenloom.datasets._hf as hf_module

    out = Path(tmp) / "out"
    init_gloo(f"file://{init_file}", rank, world_size)
    original = hf_module.HuggingFaceDataset._build
    fail = False

    def counted_build(self, *args, **kwargs):
        (out / f"build-rank{rank}-{time.monotonic_ns()}").touch()
        time.sleep(1.0)  # a slow rank 0: a rank that does not wait for it finds no cache
        if fail:
            raise RuntimeError("tokenizer crashed on rank 0")
        return original(self, *args, **kwargs)

    hf_module.HuggingFaceDataset._build = counted_build
    kwargs = {"data_files": jsonl, "seq_len": 4, "tokenizer": tokenizer_dir, "pack_sequences": True}
    ds = hf_module.HuggingFaceDataset("json", cache_dir=Path(tmp) / "cache", **kwargs)
    samples = [{key: value.tolist() for key, value in ds[i].items()} for i in range(len(ds))]
    (out / f"samples-rank{rank}.json").write_text(json.dumps({"cache": str(ds.cache_path), "samples": samples}))

    fail = True  # rank 0's build raises: every rank gets an error, none waits forever
    try:
        hf_module.HuggingFaceDataset("json", cache_dir=Path(tmp) / "cache-failing", **kwargs)
        outcome = "no error"
    except Exception as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    (out / f"failure-rank{rank}.txt").write_text(outcome)
    dist.destroy_process_group()
