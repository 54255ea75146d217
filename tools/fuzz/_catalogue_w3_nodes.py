"""Catalogue rows for #24 items 3-4 (unit plan, many nodes, Ray): the bad inputs and faults of a shared run."""

from __future__ import annotations

import importlib.util
import json
import socket
from pathlib import Path

from _catalogue_base import Outcome, Run, _tokenizer, case


def _corpus(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("a.jsonl", "b.jsonl", "c.jsonl"):
        lines = (json.dumps({"text": f"{name} document {i}: " + "alpha beta " * (1 + i % 7)}) for i in range(40))
        (directory / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return directory


def _node(inputs: Path, out: Path, nodes: int, rank: int, *extra: str) -> list[str]:
    return [
        "tokenize",
        "--input-dir",
        str(inputs),
        "--output-dir",
        str(out),
        "--tokenizer",
        str(_tokenizer()),
        "--num-nodes",
        str(nodes),
        "--node-rank",
        str(rank),
        "--num-workers",
        "0",
        "--no-progress",
        *extra,
    ]


def _first_node(inputs: Path, out: Path, seq_len: int | None = None) -> None:
    """Node 0 of 2 commits its units (and the plan) into ``out``."""
    from tokenloom.tokenize import TokenizeConfig, tokenize

    tokenizer = str(_tokenizer())
    tokenize(
        TokenizeConfig(
            input_dir=inputs,
            output_dir=out,
            tokenizer=tokenizer,
            seq_len=seq_len,
            num_nodes=2,
            node_rank=0,
            num_workers=0,
        )
    )


def _unpublished(out: Path, *words: str):
    def check(outcome: Outcome) -> str | None:
        text = outcome.stdout + outcome.stderr
        missing = [w for w in words if w not in text]
        if missing:
            return f"the error does not say {missing}"
        return f"{out}/manifest.json was published" if (out / "manifest.json").exists() else None

    return check


@case("tokenize --num-nodes: an input changed between the plan and a node's run", "bad input", "error",
      "ResumeMismatchError")  # fmt: skip
def _(tmp: Path) -> Run:
    inputs, out = _corpus(tmp / "in"), tmp / "out"
    _first_node(inputs, out)
    changed = inputs / "b.jsonl"
    changed.write_bytes(changed.read_bytes() + b'{"text": "appended after the plan"}\n')
    return Run(argv=_node(inputs, out, 2, 1), check=_unpublished(out, "b.jsonl", "changed"))


@case("tokenize --num-nodes: two nodes with different settings into one output", "bad input", "error",
      "ResumeMismatchError")  # fmt: skip
def _(tmp: Path) -> Run:
    inputs, out = _corpus(tmp / "in"), tmp / "out"
    _first_node(inputs, out, seq_len=64)
    return Run(argv=_node(inputs, out, 2, 1, "--seq-len", "32"), check=_unpublished(out, "max_length 64 -> 32"))


@case("tokenize --node-rank outside [0, --num-nodes)", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    inputs, out = _corpus(tmp / "in"), tmp / "out"

    def check(outcome: Outcome) -> str | None:
        if "node_rank is 3, outside [0, 3)" not in outcome.stdout + outcome.stderr:
            return "the error does not name node_rank and its range"
        return f"{out} was created" if out.exists() else None

    return Run(argv=_node(inputs, out, 3, 3), check=check)


def _unreachable(tmp: Path) -> Run:
    inputs, out = _corpus(tmp / "in"), tmp / "out"
    with socket.socket() as sock:  # a port nothing listens on (bound, then released)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [
        "tokenize",
        "--input-dir",
        str(inputs),
        "--output-dir",
        str(out),
        "--executor",
        "ray",
        "--ray-address",
        f"127.0.0.1:{port}",
        "--no-progress",
    ]

    def check(outcome: Outcome) -> str | None:
        if "cannot be reached" not in outcome.stdout + outcome.stderr:
            return "the error does not say the cluster cannot be reached"
        return f"{out} was created" if out.exists() else None

    return Run(argv=argv, check=check)


if importlib.util.find_spec("ray") is not None:
    case("tokenize --executor ray: a Ray cluster that cannot be reached (no hang)", "faults", "error", "ConfigError")(
        _unreachable
    )
else:
    case("tokenize --executor ray without the ray extra", "faults", "extra")(_unreachable)
