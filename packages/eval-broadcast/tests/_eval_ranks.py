"""The ranks of the distributed tests (started by conftest.run_ranks in spawned processes; not a test module).

Each scenario runs inside one gloo process group and writes ``result-rank<r>.json``.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import signal
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np


def main(rank: int, world: int, init_file: str, scenario: str, out: str, params_json: str) -> None:
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    import torch.distributed as dist

    params = json.loads(params_json)
    os.environ["HF_DATASETS_CACHE"] = str(Path(out) / f"hf-cache-rank{rank}")
    backend = params.get("backend", "gloo")
    if backend == "nccl":
        import torch

        torch.cuda.set_device(rank)
    dist.init_process_group(
        backend,
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=params.get("pg_timeout", 60)),
    )
    result: dict[str, Any] = {}
    try:
        SCENARIOS[scenario](rank, world, params, result)
    except BaseException as exc:  # recorded for the test to assert on
        result["crash"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    Path(out, f"result-rank{rank}.json").write_text(json.dumps(result))
    os._exit(0)  # after a killed peer, tearing the group down could block: the result is written


def digest(evalset: Any) -> str:
    return hashlib.sha256(evalset.numpy().tobytes()).hexdigest()


def outcome(call: Any) -> dict[str, Any]:
    """Run ``call``; the error type and message (or the value) and how long it took."""
    start = time.monotonic()
    try:
        value = call()
        if hasattr(value, "rows") and hasattr(value, "tail_padding"):
            value = describe(value)
        return {"ok": True, "value": value, "seconds": time.monotonic() - start}
    except Exception as exc:
        return {
            "ok": False,
            "type": type(exc).__name__,
            "bases": [c.__name__ for c in type(exc).__mro__],
            "message": str(exc),
            "seconds": time.monotonic() - start,
        }


def describe(evalset: Any) -> dict[str, Any]:
    return {
        "sha256": digest(evalset),
        "shape": list(evalset.rows.shape),
        "dtype": str(evalset.rows.dtype),
        "tail_padding": evalset.tail_padding,
        "eos_id": evalset.eos_id,
        "vocab_size": evalset.vocab_size,
        "origin": evalset.origin,
    }


def stream(num_tokens: int, vocab: int, eos: int, seed: int = 7) -> np.ndarray:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, size=num_tokens, dtype=np.int64)
    tokens[rng.random(num_tokens) < 0.05] = eos  # documents of ~20 tokens
    return tokens


def suite(rank: int, world: int, params: dict[str, Any], result: dict[str, Any]) -> None:
    from tokenloom.eval_broadcast import EvalDataset, EvalTokens, broadcast_eval_set, token_weighted_mean

    vocab, eos, seq_len = 1000, 999, 15
    tokens = stream(5003, vocab, eos)  # 312 full rows of 16 + 11 tokens
    common: dict[str, Any] = {"seq_len": seq_len, "timeout": 20, "chunk_bytes": 1000}  # 10 chunks of rows bytes

    def build() -> Any:
        return EvalTokens(tokens, eos_id=eos, vocab_size=vocab)

    result["equal"] = outcome(lambda: broadcast_eval_set(build, **common))
    rows = tokens[: 300 * 16].reshape(300, 16)
    last = world - 1
    result["rows_from_last"] = outcome(lambda: broadcast_eval_set(lambda: rows, src=last, **common))
    result["empty"] = outcome(lambda: broadcast_eval_set(lambda: np.zeros(0, np.int64), **common))
    result["short"] = outcome(lambda: broadcast_eval_set(lambda: tokens[:5], **common))
    result["short_dropped"] = outcome(lambda: broadcast_eval_set(lambda: tokens[:5], drop_remainder=True, **common))

    def failing() -> Any:
        raise RuntimeError("tokenizer exploded on document 17: " + "x" * 10_000)

    result["failure"] = outcome(lambda: broadcast_eval_set(failing, **common))
    result["three_d"] = outcome(lambda: broadcast_eval_set(lambda: np.zeros((2, 2, 16), np.int64), **common))
    result["too_large_id"] = outcome(lambda: broadcast_eval_set(lambda: tokens, vocab_size=500, **common))
    result["wrong_row_len"] = outcome(lambda: broadcast_eval_set(lambda: tokens[:170].reshape(10, 17), **common))

    def slow() -> Any:
        time.sleep(1.5)  # three times the timeout: the heartbeat keeps the receivers waiting
        return build()

    result["slow_build"] = outcome(lambda: broadcast_eval_set(slow, **{**common, "timeout": 0.5}))
    result["src_outside"] = outcome(lambda: broadcast_eval_set(build, src=world, **common))
    result["mismatch"] = outcome(
        lambda: broadcast_eval_set(build, **{**common, "chunk_bytes": 1000 + (rank == last and world > 1)})
    )

    # a receiver whose bytes arrive corrupted: every rank must raise, none may evaluate another set
    import tokenloom.eval_broadcast._broadcast as broadcast_module

    original = broadcast_module._Channel.broadcast
    flipped = {"done": False}

    def corrupting(self: Any, tensor: Any, what: str) -> None:
        original(self, tensor, what)
        if what.startswith("rows bytes") and not flipped["done"]:
            tensor[0] ^= 1
            flipped["done"] = True

    if world > 1 and rank == last:
        broadcast_module._Channel.broadcast = corrupting  # type: ignore[method-assign]
    result["corrupted"] = outcome(lambda: broadcast_eval_set(build, **common))
    broadcast_module._Channel.broadcast = original  # type: ignore[method-assign]

    import torch.distributed as dist

    members = list(range(1, world)) if world >= 3 else [0]  # with 3+ ranks, group rank 0 is global rank 1
    subgroup = dist.new_group(members, backend="gloo")
    result["subgroup"] = outcome(lambda: broadcast_eval_set(build, group=subgroup, **common))
    result["subgroup_member"] = rank in members

    # exact, token-weighted eval loss with a fixed model
    import torch

    evalset = broadcast_eval_set(build, **common)
    share = EvalDataset(evalset.split(rank, world), pack_sequences=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, 8), torch.nn.Linear(8, vocab)).double()
    loss_sum = torch.zeros((), dtype=torch.float64)
    count = torch.zeros((), dtype=torch.int64)
    loader = torch.utils.data.DataLoader(share, batch_size=7)
    with torch.no_grad():
        for batch in loader:
            logits = model(batch["input_ids"])
            loss_sum += torch.nn.functional.cross_entropy(
                logits.reshape(-1, vocab), batch["labels"].reshape(-1), ignore_index=-100, reduction="sum"
            )
            count += (batch["labels"] != -100).sum()
    result["loss"] = float(token_weighted_mean(loss_sum, count))
    result["rows_here"] = len(share)
    result["labels_here"] = int(count)


def kill_receiver(rank: int, world: int, params: dict[str, Any], result: dict[str, Any]) -> None:
    """Rank ``victim`` dies (SIGKILL) after receiving two chunks; the others must fail within the timeout."""
    import tokenloom.eval_broadcast._broadcast as broadcast_module
    from tokenloom.eval_broadcast import broadcast_eval_set

    victim = params["victim"]
    if rank == victim:
        original = broadcast_module._Channel.broadcast
        seen = {"chunks": 0}

        def dying(self: Any, tensor: Any, what: str) -> None:
            original(self, tensor, what)
            if what.startswith("rows bytes"):
                seen["chunks"] += 1
                if seen["chunks"] == 2:
                    os.kill(os.getpid(), signal.SIGKILL)

        broadcast_module._Channel.broadcast = dying  # type: ignore[method-assign]
    tokens = stream(200_000, 1000, 999)
    result["transfer"] = outcome(
        lambda: broadcast_eval_set(lambda: tokens, seq_len=99, timeout=params["timeout"], chunk_bytes=10_000)
    )


def source_dies(rank: int, world: int, params: dict[str, Any], result: dict[str, Any]) -> None:
    """The source kills (SIGKILL) or stops (SIGSTOP) itself while building."""
    from tokenloom.eval_broadcast import broadcast_eval_set

    def build() -> Any:
        time.sleep(0.3)  # a heartbeat or two first
        os.kill(os.getpid(), getattr(signal, params["signal"]))
        return np.zeros(10, np.int64)

    result["transfer"] = outcome(lambda: broadcast_eval_set(build, seq_len=4, timeout=params["timeout"]))


def memory(rank: int, world: int, params: dict[str, Any], result: dict[str, Any]) -> None:
    """Peak memory of a receiving rank beyond the result it must hold (VmHWM, reset before the call)."""
    from tokenloom.eval_broadcast import broadcast_eval_set

    num_tokens, chunk = params["num_tokens"], params["chunk_bytes"]
    seq_len = 2047

    def build() -> Any:
        return (np.arange(num_tokens, dtype=np.uint32) % 50_257).astype(np.uint16)

    # warm up the transport (connection buffers, lazy imports) before measuring
    broadcast_eval_set(lambda: np.arange(4096, dtype=np.uint16), seq_len=seq_len, chunk_bytes=chunk, timeout=60)
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    before = _status_kib("VmRSS")
    evalset = broadcast_eval_set(build, seq_len=seq_len, vocab_size=50_257, chunk_bytes=chunk, timeout=120)
    peak = _status_kib("VmHWM")
    result.update(
        before_kib=before,
        peak_kib=peak,
        result_bytes=evalset.rows.numel() * evalset.rows.element_size(),
        dtype=str(evalset.rows.dtype),
        sha256=digest(evalset),
        origin=evalset.origin,
    )


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def hf_cache(rank: int, world: int, params: dict[str, Any], result: dict[str, Any]) -> None:
    """One broadcast per entry of ``params["shared"]`` (shared_filesystem off / on), each with a fresh source."""
    from tokenloom.eval_broadcast import HFEvalSource, broadcast_eval_set

    runs = []
    for shared in params["shared"]:
        source = HFEvalSource("json", data_files=params["jsonl"], split="train", tokenizer=params["tokenizer"])
        evalset = broadcast_eval_set(
            source, seq_len=6, cache_dir=params["cache_dir"], shared_filesystem=shared, timeout=60
        )
        runs.append({**describe(evalset), "tokenized": source.documents_tokenized, "rows": evalset.numpy().tolist()})
    result["runs"] = runs


def nccl(rank: int, world: int, params: dict[str, Any], result: dict[str, Any]) -> None:
    """The NCCL path: the same set on every GPU rank, and a failing build raised everywhere."""
    from tokenloom.eval_broadcast import EvalTokens, broadcast_eval_set

    tokens = stream(100_003, 50_000, 49_999)
    build = lambda: EvalTokens(tokens, eos_id=49_999, vocab_size=50_000)  # noqa: E731
    result["equal"] = outcome(lambda: broadcast_eval_set(build, seq_len=127, chunk_bytes=30_000, timeout=60))

    def failing() -> Any:
        raise RuntimeError("no such split")

    result["failure"] = outcome(lambda: broadcast_eval_set(failing, seq_len=127, timeout=60))


SCENARIOS = {
    "nccl": nccl,
    "suite": suite,
    "kill_receiver": kill_receiver,
    "source_dies": source_dies,
    "memory": memory,
    "hf_cache": hf_cache,
}
