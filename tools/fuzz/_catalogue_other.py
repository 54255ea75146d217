"""Catalogue rows: curriculum, stream-state, eval-cache and the Python readers."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _catalogue_base import (
    CASES,
    Case,
    Run,
    _mkdir,
    _tokenizer,
    _write,
    copy,
    first,
    flip,
    truncate,
)
from click.testing import CliRunner

from tokenloom.formats import open_writer
from tokenloom.formats.cli.group import main as tokenloom_main

# -- other commands: curriculum, stream-state, eval-cache; Python readers --------------------------------


def _curriculum_corpus(tmp: Path) -> Path:
    root = tmp / "buckets"
    for split in ("train", "val"):
        for name in ("a", "b"):
            with open_writer(root / split / name, format="native", dtype="uint16", vocab_size=65536, eos_id=65535) as w:
                for start in range(0, 2000 if split == "train" else 200, 50):
                    w.add(np.append(np.arange(start, start + 49) % 60000, 65535))
    return root


def _curriculum_yaml(tmp: Path, text: str | None = None, **data: Any) -> Path:
    import yaml

    path = tmp / "curriculum.yaml"
    if text is not None:
        path.write_text(text)
        return path
    base = {
        "path": str(_curriculum_corpus(tmp)),
        "seq_len": 16,
        "packing": False,
        "curriculum": [{"duration_tokens": 400, "mix": {"a": 1, "b": 1}}],
    }
    base.update(data)
    path.write_text(yaml.safe_dump({"data": base}))
    return path


CURRICULUM_BAD: dict[str, Callable[[Path], Path]] = {
    "yaml-syntax-error": lambda t: _curriculum_yaml(t, "data: [unclosed\n"),
    "not-a-mapping": lambda t: _curriculum_yaml(t, "- 1\n- 2\n"),
    "unknown-bucket": lambda t: _curriculum_yaml(t, curriculum=[{"duration_tokens": 400, "mix": {"zz": 1}}]),
    "negative-duration": lambda t: _curriculum_yaml(t, curriculum=[{"duration_tokens": -5, "mix": {"a": 1}}]),
    "weights-zero": lambda t: _curriculum_yaml(t, curriculum=[{"duration_tokens": 400, "mix": {"a": 0, "b": 0}}]),
    "data-path-missing": lambda t: _curriculum_yaml(t, path=str(t / "nowhere")),
    "unknown-key": lambda t: _curriculum_yaml(t, shuffle_buffer=7),
    "budget-exceeds-data": lambda t: _curriculum_yaml(t, curriculum=[{"duration_tokens": 10**9, "mix": {"a": 1}}]),
    "bucket-corrupt": lambda t: _corrupt_bucket(_curriculum_yaml(t)),
    "empty-file": lambda t: _curriculum_yaml(t, ""),
}


def _corrupt_bucket(config: Path) -> Path:
    truncate(first(config.parent / "buckets" / "train" / "a", "*.bin"))
    return config


def register_other_commands() -> None:
    for name, make in CURRICULUM_BAD.items():
        for command in (["curriculum", "plan"], ["validate", "--curriculum"]):

            def setup(tmp: Path, make=make, command=command) -> Run:
                config = make(tmp)
                return Run(argv=[*command, str(config)], sources=[config])

            CASES.append(Case(f"{' '.join(command)} {name}", "curriculum", setup, "report"))
    status_bad = {
        "missing-run-directory": lambda t: t / "nowhere",
        "no-status-file": lambda t: _mkdir(t / "run"),
        "status-not-json": lambda t: _write(t / "run" / "run_status.json", "{oops"),
        "status-unknown-value": lambda t: _write(t / "run" / "run_status.json", json.dumps({"status": "exploded"})),
        "status-not-an-object": lambda t: _write(t / "run" / "run_status.json", "[1, 2]"),
    }
    for name, make in status_bad.items():

        def setup(tmp: Path, make=make) -> Run:
            return Run(argv=["curriculum", "status", str(make(tmp))])

        CASES.append(Case(f"curriculum status {name}", "curriculum", setup, "error"))
    state_bad = {
        "empty-directory": lambda t: _mkdir(t / "ckpt"),
        "state-not-json": lambda t: _write(t / "ckpt" / "hf_stream_rank00000.json", "{oops").parent,
        "state-wrong-shape": lambda t: _write(t / "ckpt" / "hf_stream_rank00000.json", json.dumps({"a": 1})).parent,
        "state-list": lambda t: _write(t / "ckpt" / "hf_stream_rank00000.json", "[]").parent,
        "missing-directory": lambda t: t / "nowhere",
    }
    for name, make in state_bad.items():

        def setup(tmp: Path, make=make) -> Run:
            return Run(argv=["stream-state", str(make(tmp))])

        CASES.append(Case(f"stream-state {name}", "stream-state", setup, "error"))
    eval_bad = {
        "cache-dir-is-a-file": lambda t: [
            "--path",
            str(copy("native", t)),
            "--seq-len",
            "8",
            "--cache-dir",
            str(_write(t / "file", "x")),
        ],
        "neither-path-nor-data-files": lambda t: ["--seq-len", "8", "--cache-dir", str(t / "c")],
        "data-files-missing": lambda t: [
            "--data-files",
            str(t / "none.jsonl"),
            "--tokenizer",
            str(_tokenizer()),
            "--seq-len",
            "8",
            "--cache-dir",
            str(t / "c"),
        ],
        "text-field-absent": lambda t: [
            "--data-files",
            str(copy("corpus", t) / "a.jsonl"),
            "--tokenizer",
            str(_tokenizer()),
            "--text-field",
            "body",
            "--seq-len",
            "8",
            "--cache-dir",
            str(t / "c"),
        ],
        "seq-len-larger-than-data": lambda t: [
            "--path",
            str(copy("native", t)),
            "--seq-len",
            "100000",
            "--cache-dir",
            str(t / "c"),
            "--drop-remainder",
        ],
        "cache-corrupt-rebuilt-or-named": lambda t: _eval_cache_corrupt(t),
    }
    for name, make in eval_bad.items():

        def setup(tmp: Path, make=make) -> Run:
            return Run(argv=["eval-cache", *make(tmp), "--no-progress"])

        # an empty eval set is legal with a warning (documented in tokenloom-eval-broadcast)
        expect = "ok" if name in ("cache-corrupt-rebuilt-or-named", "seq-len-larger-than-data") else "error"
        CASES.append(Case(f"eval-cache {name}", "eval-cache", setup, expect))
    register_python_readers()


def _eval_cache_corrupt(tmp: Path) -> list[str]:
    args = ["--path", str(copy("native", tmp)), "--seq-len", "8", "--cache-dir", str(tmp / "c")]
    done = CliRunner().invoke(tokenloom_main, ["eval-cache", *args, "--no-progress"])
    if done.exit_code != 0:
        raise RuntimeError(done.output)
    for file in (tmp / "c").rglob("*"):
        if file.is_file() and file.stat().st_size > 64:
            flip(file)
    return args


def register_python_readers() -> None:
    from tokenloom.formats import open_records, open_store
    from tokenloom.tokenize.jsonl_index import JsonlIndex

    def reader(name: str, make: Callable[[Path], Callable[[], Any]], *errors: str, expect: str = "error") -> None:
        CASES.append(Case(name, "Python readers", lambda tmp: Run(call=make(tmp)), expect, tuple(errors)))

    reader("open_store missing path", lambda t: lambda: open_store(t / "none"), "MissingFileError")
    reader("open_store unknown training type", lambda t: lambda: open_store(copy("store-bin", t), train_type="x"))
    reader(
        "open_store dpo keys absent",
        lambda t: lambda: open_store(copy("store-bin", t), train_type="dpo"),
        "MissingKeyError",
    )
    reader(
        "open_store h5 training type sft, loss_mask absent",
        lambda t: lambda: open_store(copy("store.h5", t), train_type="sft"),
        "MissingKeyError",
    )
    reader(
        "open_records on tokenloom's keyed store (per-segment offsets: one record each)",
        lambda t: lambda: len(open_records(copy("store-bin", t))),
        expect="ok",
    )
    reader("open_records on a file", lambda t: lambda: open_records(copy("data.pbin", t)), "FormatError")
    reader("open_records on an empty directory", lambda t: lambda: open_records(_mkdir(t / "e")), "MissingFileError")
    reader("JsonlIndex on a missing file", lambda t: lambda: JsonlIndex(t / "none.jsonl"))
    reader("JsonlIndex on a directory", lambda t: lambda: JsonlIndex(_mkdir(t / "d.jsonl")))
    reader(
        "JsonlIndex line out of range",
        lambda t: lambda: JsonlIndex(copy("corpus", t) / "a.jsonl").raw(10**6),
        expect="index",
    )
    reader(
        "open_dataset unknown format name",
        lambda t: lambda: __import__("tokenloom.formats").formats.open_dataset(copy("native", t), format="parquet"),
        "ConfigError",
    )
    reader(
        "open_dataset validate='paranoid'",
        lambda t: lambda: __import__("tokenloom.formats").formats.open_dataset(copy("native", t), validate="paranoid"),
        "ConfigError",
    )
    reader(
        "open_dataset option for another format",
        lambda t: lambda: __import__("tokenloom.formats").formats.open_dataset(copy("native", t), vocab_size=5),
        "ConfigError",
    )
    reader(
        "open_dataset dtype ',u2'",
        lambda t: lambda: __import__("tokenloom.formats").formats.open_dataset(copy("flat-bin", t), dtype=",u2"),
        "ConfigError",
    )
    reader(
        "PackedDocumentDataset seq_len 0",
        lambda t: lambda: __import__("tokenloom.datasets").datasets.PackedDocumentDataset(copy("native", t), 0),
        "ConfigError",
    )
    reader("MemoryMappedDataset seq_len beyond the data", lambda t: lambda: _windows(copy("native", t), 10**6))


def _windows(path: Path, seq_len: int) -> Any:
    from tokenloom.datasets import MemoryMappedDataset

    ds = MemoryMappedDataset(path, seq_len)
    if len(ds) == 0:
        raise RuntimeError("an empty dataset without an error")
    return ds
