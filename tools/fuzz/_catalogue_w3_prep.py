"""Catalogue rows for #24 item 3 with sub-file units (one big file cut into byte ranges or row-group runs)."""

from __future__ import annotations

import json
from pathlib import Path

from _catalogue_base import Outcome, Run, _tokenizer, case

UNIT_BYTES = 4000


def _big_corpus(directory: Path) -> Path:
    """One .jsonl of about 20 KB: five or more units at UNIT_BYTES."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = (json.dumps({"text": f"document {i}: " + "alpha beta gamma " * (1 + i % 9)}) for i in range(300))
    (directory / "big.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return directory


def _node(inputs: Path, out: Path, rank: int) -> list[str]:
    return [
        "tokenize",
        f"--input-dir={inputs}",
        f"--output-dir={out}",
        f"--tokenizer={_tokenizer()}",
        "--num-nodes=2",
        f"--node-rank={rank}",
        f"--unit-bytes={UNIT_BYTES}",
        "--num-workers=0",
        "--no-progress",
    ]


def _first_node(inputs: Path, out: Path) -> None:
    from tokenloom.tokenize import TokenizeConfig, tokenize

    config = TokenizeConfig(
        input_dir=inputs,
        output_dir=out,
        tokenizer=str(_tokenizer()),
        num_nodes=2,
        node_rank=0,
        num_workers=0,
        unit_bytes=UNIT_BYTES,
    )
    tokenize(config)


def _unpublished(out: Path, *words: str):
    def check(outcome: Outcome) -> str | None:
        text = outcome.stdout + outcome.stderr
        missing = [w for w in words if w not in text]
        if missing:
            return f"the error does not say {missing}"
        return f"{out}/manifest.json was published" if (out / "manifest.json").exists() else None

    return check


@case("tokenize --unit-bytes: a big file cut into byte ranges, edited in place between the plan and a node's run",
      "bad input", "error", "ResumeMismatchError")  # fmt: skip
def _(tmp: Path) -> Run:
    inputs, out = _big_corpus(tmp / "in"), tmp / "out"
    _first_node(inputs, out)
    big = inputs / "big.jsonl"
    data = big.read_bytes()
    big.write_bytes(data[:50] + b'{"text": "inserted"}\n' + data[50:])  # every later cut point moves
    return Run(argv=_node(inputs, out, 1), check=_unpublished(out, "big.jsonl", "changed"))


@case("tokenize --unit-bytes: the second node asks for another unit size (another plan)", "bad input", "error",
      "ResumeMismatchError")  # fmt: skip
def _(tmp: Path) -> Run:
    inputs, out = _big_corpus(tmp / "in"), tmp / "out"
    _first_node(inputs, out)
    argv = [a if not a.startswith("--unit-bytes=") else "--unit-bytes=9000" for a in _node(inputs, out, 1)]
    return Run(argv=argv, check=_unpublished(out, "unit_bytes"))


def _tree(directory: Path, *extra: str) -> Path:
    """IN/train/<bucket>/part.jsonl for two buckets, plus ``extra`` relative files of one document each."""
    for name in ("train/web/part.jsonl", "train/code/part.jsonl", *extra):
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = (json.dumps({"text": f"{name} document {i}: alpha beta"}) for i in range(20))
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return directory


def _tree_run(inputs: Path, out: Path, *extra: str) -> list[str]:
    return ["tokenize", f"--input-dir={inputs}", f"--output-dir={out}", f"--tokenizer={_tokenizer()}",
            "--layout=tree", "--num-workers=0", "--no-progress", *extra]  # fmt: skip


def _nothing_written(out: Path, *words: str):
    def check(outcome: Outcome) -> str | None:
        text = outcome.stdout + outcome.stderr
        missing = [w for w in words if w not in text]
        if missing:
            return f"the error does not say {missing}"
        return f"{out} was created" if out.exists() else None

    return check


@case("tokenize --layout tree: an input file outside IN/<split>/<bucket>/", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    inputs, out = _tree(tmp / "in", "train/stray.jsonl"), tmp / "out"
    return Run(argv=_tree_run(inputs, out), check=_nothing_written(out, "train/stray.jsonl", "<split>/<bucket>"))


@case("tokenize --layout tree --val-fraction: the input already has a val split", "bad input", "error",
      "ConfigError")  # fmt: skip
def _(tmp: Path) -> Run:
    inputs, out = _tree(tmp / "in", "val/web/part.jsonl"), tmp / "out"
    return Run(argv=_tree_run(inputs, out, "--val-fraction=0.1"), check=_nothing_written(out, "val split"))
