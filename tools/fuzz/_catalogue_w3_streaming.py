"""Catalogue rows for wave 3's correctness issue (#21): the streaming items that are an input or a fault."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _catalogue_base import Run, _tokenizer, case, copy

# -- hf-streaming: over-long lines, damaged states, skewed saves, a FIFO as a state file ----------------


def _dataset(files: list[str], **options: Any) -> Any:
    from tokenloom.hf_streaming import StreamingHuggingFaceDataset

    settings: dict[str, Any] = {"seq_len": 8, "shuffle_buffer_size": 4, "data_files": files}
    settings.update(options)
    return StreamingHuggingFaceDataset("json", "train", "text", tokenizer_path=str(_tokenizer()), **settings)


def _corpus(tmp: Path) -> list[str]:
    return [str(p) for p in sorted(copy("corpus", tmp).glob("*.jsonl"))]


def _state(tmp: Path, **options: Any) -> dict[str, Any]:
    ds = _dataset(_corpus(tmp), **options)
    stream = iter(ds)
    for _ in range(3):
        next(stream)
    return json.loads(json.dumps(ds.state_dict()))


@case(
    "hf-streaming: a 70 MiB jsonl line (cap 64 MiB) is refused, never read whole",
    "hf-streaming",
    "error",
    "RecordError",
)
def _long_line(tmp: Path) -> Run:
    path = tmp / "long.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"text": "a b"}\n{"text": "')
        f.write(b"word " * (14 << 20))
        f.write(b'"}\n')
    return Run(call=lambda: list(_dataset([str(path)])), sources=[path])


def _load_damaged(damage: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[Path], Run]:
    def setup(tmp: Path) -> Run:
        damaged = damage(_state(tmp))

        def call() -> Any:
            ds = _dataset(_corpus(tmp / "again"))
            ds.load_state_dict(damaged)
            return list(ds)

        (tmp / "again").mkdir()
        return Run(call=call)

    return setup


def _drop(key: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda state: {k: v for k, v in state.items() if k != key}


for _name, _damage in {
    "without fingerprint": _drop("fingerprint"),
    "without world_size": _drop("world_size"),
    "with a garbage layout": lambda s: {**s, "layout": {"unit_bytes": "x", "split": [], "stride": None}},
    "with a garbage base": lambda s: {**s, "base": {"start": 0, "epochs": [{"epoch": 0, "done": "all"}]}},
    "with a unit cursor past the data": lambda s: {**s, "item": 999},
    "with a negative unit cursor": lambda s: {**s, "item": -3},
    "with a row past the data": lambda s: {**s, "current": [10**6, 0, -1]},
}.items():
    case(f"hf-streaming: load_state_dict of a state {_name}", "hf-streaming", "error", "ResumeMismatchError")(
        _load_damaged(_damage)
    )


@case("hf-streaming: merge_rank_states on garbage slot states", "hf-streaming", "error", "ResumeMismatchError")
def _merge_garbage(tmp: Path) -> Run:
    from tokenloom.hf_streaming import merge_rank_states

    garbage = [{"format": "tokenloom.hf_streaming", "version": 1, "kind": "slot", "rank": "zero"}]
    return Run(call=lambda: merge_rank_states(garbage))


def _loader_states(tmp: Path, steps: list[int]) -> Path:
    from torchdata.stateful_dataloader import StatefulDataLoader

    from tokenloom.hf_streaming import save_rank_state

    files = _corpus(tmp)
    for rank, count in enumerate(steps):
        loader = StatefulDataLoader(_dataset(files, rank=rank, world_size=len(steps)), batch_size=2)
        iterator = iter(loader)
        for _ in range(count):
            next(iterator)
        save_rank_state(tmp / "ckpt", rank, loader.state_dict())
    return tmp / "ckpt"


@case("stream-state: ranks saved at different steps (3 and 5)", "hf-streaming", "error", "ResumeMismatchError")
def _skewed_steps(tmp: Path) -> Run:
    return Run(argv=["stream-state", str(_loader_states(tmp, [3, 5]))])


@case("stream-state: a FIFO where rank 1's state file is expected", "hf-streaming", "error", "UnsafePathError")
def _fifo_state(tmp: Path) -> Run:
    from tokenloom.hf_streaming import save_rank_state

    save_rank_state(tmp / "ckpt", 0, _state(tmp))
    os.mkfifo(tmp / "ckpt" / "hf_stream_rank00001.json")
    return Run(argv=["stream-state", str(tmp / "ckpt"), "--world-size", "2"])
