"""Bad-input catalogue: every command and reader against bad inputs (not a CI test; results in docs/fuzz.md).

    uv run python tools/fuzz/catalogue.py                 # every case, a table, exit 1 on any failure
    uv run python tools/fuzz/catalogue.py -k convert      # cases whose name contains "convert"

Each row is (name, setup, command, expectation). ``setup`` builds the inputs in a fresh
directory; the command is a ``tokenloom`` command line run in this process (the real
root group, subcommands from the entry points), a real process (OS failures, the
writer lock, a missing extra), or a Python reader call. Expectations:

- ``error``: exit 1 or 2 and exactly one output line naming a DataError class
  (``Error: FormatError: ...``, or validate's ``  FormatError: ...``), no traceback;
  a Python call raises a DataError (of the named class when one is given);
- ``ok``: exit 0 (the call returns) and the case's own check of the result passes;
- ``extra``: a missing optional dependency, one line naming the pip command, exit 2.

Every case also names its sources: their bytes must be unchanged afterwards ("nothing
lost"). OS failures use a real tmpfs (ENOSPC, EROFS) and setpriv (EACCES) as root; where
mounting is impossible they are simulated with an OSError raised at the first write.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import hashlib
import io
import json
import logging
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from click.testing import CliRunner

from tokenloom.formats import DataError, describe_files, open_writer, read_manifest, write_manifest
from tokenloom.formats._cli import main as tokenloom_main

for _name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ[_name] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

TIMEOUT_S = 120


def _all_subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub} | _all_subclasses(sub)
    return found


def data_errors() -> set[str]:
    """Names of every DataError class (read late: packages add theirs when imported)."""
    return {c.__name__ for c in _all_subclasses(DataError)} | {"DataError"}
ERROR_LINE = re.compile(r"^\s*(?:Error: )?([A-Z][A-Za-z]+Error): ")


# -- rows ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Run:
    """What a case's setup returns: one command and what must survive it."""

    argv: list[str] | None = None  # a tokenloom command line, in this process
    process: list[str] | None = None  # a full command line, in a real process
    call: Callable[[], Any] | None = None  # a Python reader call
    sources: list[Path] = dataclasses.field(default_factory=list)  # bytes must be unchanged afterwards
    check: Callable[[Outcome], str | None] | None = None  # extra check; returns a problem or None
    env: dict[str, str] | None = None
    cleanup: Callable[[], None] | None = None


@dataclasses.dataclass
class Outcome:
    exit_code: int
    stdout: str = ""
    stderr: str = ""
    exception: BaseException | None = None
    value: Any = None


@dataclasses.dataclass
class Case:
    name: str
    group: str
    setup: Callable[[Path], Run]
    expect: str  # "error" | "ok" | "extra"
    error: tuple[str, ...] = ()  # acceptable DataError class names (empty: any)


CASES: list[Case] = []


def case(name: str, group: str, expect: str, *error: str) -> Callable[[Callable[[Path], Run]], Callable[[Path], Run]]:
    def register(setup: Callable[[Path], Run]) -> Callable[[Path], Run]:
        CASES.append(Case(name, group, setup, expect, tuple(error)))
        return setup

    return register


# -- shared fixtures (built once, copied per case) -----------------------------------------------------

BASE = Path(tempfile.mkdtemp(prefix="tokenloom-catalogue-"))
VALID = BASE / "valid"
TEXTS = [f"document {i}: " + " ".join(["alpha", "beta", "gamma", "delta"][: 1 + i % 4] * (1 + i % 7)) for i in range(40)]


def _docs(n: int = 12) -> list[np.ndarray]:
    rng = np.random.default_rng(n)
    return [np.append(rng.integers(1, 250, int(rng.integers(1, 30))), 0) for _ in range(n)]


def _tokenizer() -> Path:
    from tokenloom.tokenize import default_tokenizer_path

    return Path(default_tokenizer_path())


def build_valid() -> None:
    VALID.mkdir(parents=True)
    corpus = VALID / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS[:20]))
    (corpus / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS[20:]))
    for fmt, target, options in (
        ("native", VALID / "native", {"shard_size_tokens": 60}),
        ("flat", VALID / "flat", {"shard_size_tokens": 60}),
        ("flat", VALID / "flat-bin", {"file_format": "bin"}),
        ("megatron", VALID / "megatron" / "data", {}),
        ("packed", VALID / "data.pbin", {}),
    ):
        with open_writer(target, format=fmt, dtype="uint16", vocab_size=256, eos_id=0, **options) as w:
            for doc in _docs():
                w.add(doc)
    for fmt, target in (("h5", VALID / "store.h5"), ("bin-meta", VALID / "store-bin")):
        with open_writer(target, format=fmt, dtype="uint16", vocab_size=256, eos_id=0, training_type="seq") as w:
            for doc in _docs(8):
                w.add_keyed({"sequence": doc})
    gpts = VALID / "gpt-simple"
    gpts.mkdir()
    docs = _docs(8)
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype("<i8")
    (gpts / "shard_00000.bin").write_bytes(np.concatenate(docs).astype("<u2").tobytes())
    header = b"GPTS" + np.array([1, 2, len(docs)], "<u4").tobytes()
    (gpts / "shard_00000.idx").write_bytes(header + offsets.tobytes() + np.zeros(len(docs), "<u2").tobytes())
    tatm = VALID / "tatm"
    tatm.mkdir()
    (tatm / "metadata.yaml").write_text(
        "name: x\ntokenized_info:\n  dtype: uint16\n  file_extension: bin\n  file_prefix: /else/tok\n  vocab_size: 256\n"
    )
    np.concatenate(_docs(6)).astype("<u2").tofile(tatm / "tok_0.bin")
    v0 = VALID / "native-v0"
    shutil.copytree(VALID / "native", v0)
    manifest = read_manifest(v0)
    for f in manifest.files:
        if f.name.endswith(".idx"):
            raw = (v0 / f.name).read_bytes()
            count = struct.unpack_from("<I", raw, 12)[0]
            (v0 / f.name).write_bytes(struct.pack("<4sHHQ", b"GPTS", 1, 2, count) + raw[16:])
    files = describe_files(v0, [(f.name, f.role) for f in manifest.files])
    write_manifest(v0, dataclasses.replace(manifest, version=1, files=files, checksum=""))


def copy(name: str, tmp: Path) -> Path:
    source = VALID / name
    target = tmp / source.name
    if source.is_dir():
        shutil.copytree(source, target, symlinks=True)
    else:
        shutil.copy(source, target)
    return target


def first(path: Path, pattern: str) -> Path:
    return sorted(path.glob(pattern))[0]


def flip(path: Path, at: int | None = None) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2 if at is None else at] ^= 0x5A
    path.write_bytes(bytes(raw))


def truncate(path: Path, keep: int | None = None) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2 if keep is None else keep])


# -- bad token datasets x the commands that read them ---------------------------------------------------


def _bad_native(tmp: Path, damage: Callable[[Path], None]) -> Path:
    path = copy("native", tmp)
    damage(path)
    return path


BAD_DATASETS: dict[str, tuple[Callable[[Path], Path], str, tuple[str, ...]]] = {}
"""name -> (build(tmp) -> path, detected by "fast"|"deep", acceptable error classes)."""


def bad(name: str, detected: str = "fast", *errors: str) -> Callable[[Callable[[Path], Path]], Callable[[Path], Path]]:
    def register(build: Callable[[Path], Path]) -> Callable[[Path], Path]:
        BAD_DATASETS[name] = (build, detected, errors)
        return build

    return register


@bad("missing-path", "fast", "MissingFileError")
def _(tmp: Path) -> Path:
    return tmp / "does-not-exist"


@bad("empty-directory", "fast", "FormatError")
def _(tmp: Path) -> Path:
    (tmp / "empty").mkdir()
    return tmp / "empty"


@bad("empty-file", "fast")
def _(tmp: Path) -> Path:
    (tmp / "data.bin").write_bytes(b"")
    return tmp / "data.bin"


@bad("directory-of-other-files", "fast", "FormatError")
def _(tmp: Path) -> Path:
    (tmp / "notes").mkdir()
    (tmp / "notes" / "readme.txt").write_text("hello")
    return tmp / "notes"


@bad("native-truncated-bin", "fast", "ChecksumError")
def _(tmp: Path) -> Path:
    return _bad_native(tmp, lambda p: truncate(first(p, "*.bin")))


@bad("native-truncated-idx", "fast", "ChecksumError")
def _(tmp: Path) -> Path:
    return _bad_native(tmp, lambda p: truncate(first(p, "*.idx")))


@bad("native-idx-byte-flip", "fast", "ChecksumError")
def _(tmp: Path) -> Path:
    return _bad_native(tmp, lambda p: flip(first(p, "*.idx")))


@bad("native-bin-byte-flip-in-range", "deep", "ChecksumError")
def _(tmp: Path) -> Path:
    def in_range(p: Path) -> None:  # the low byte of a token < 250: still a valid id, only the checksum sees it
        shard = first(p, "*.bin")
        raw = bytearray(shard.read_bytes())
        raw[(len(raw) // 4) * 2] ^= 0x01
        shard.write_bytes(bytes(raw))

    return _bad_native(tmp, in_range)


@bad("native-bin-byte-flip-out-of-range", "deep", "ChecksumError", "TokenRangeError")
def _(tmp: Path) -> Path:
    def out_of_range(p: Path) -> None:  # the high byte: an id >= the vocabulary
        shard = first(p, "*.bin")
        raw = bytearray(shard.read_bytes())
        raw[(len(raw) // 4) * 2 + 1] ^= 0x40
        shard.write_bytes(bytes(raw))

    return _bad_native(tmp, out_of_range)


@bad("native-manifest-not-json", "fast", "FormatError")
def _(tmp: Path) -> Path:
    return _bad_native(tmp, lambda p: (p / "manifest.json").write_text("{not json"))


@bad("native-manifest-edited", "fast")
def _(tmp: Path) -> Path:
    def edit(p: Path) -> None:
        text = (p / "manifest.json").read_text()
        (p / "manifest.json").write_text(text.replace('"vocab_size": 256', '"vocab_size": 255'))

    return _bad_native(tmp, edit)


@bad("native-listed-shard-missing", "fast", "MissingFileError")
def _(tmp: Path) -> Path:
    return _bad_native(tmp, lambda p: first(p, "*.idx").unlink())


@bad("native-writer-marker", "fast", "FormatError")
def _(tmp: Path) -> Path:
    return _bad_native(tmp, lambda p: (p / ".tokenloom-writing").write_text("{}"))


@bad("native-shard-symlink-outside", "fast", "UnsafePathError")
def _(tmp: Path) -> Path:
    def escape(p: Path) -> None:
        target = first(p, "*.bin")
        outside = tmp / "outside.bin"
        shutil.move(target, outside)
        target.symlink_to(outside)

    return _bad_native(tmp, escape)


@bad("native-v0-layout-detected", "fast", "FormatError")
def _(tmp: Path) -> Path:
    return copy("native-v0", tmp)


@bad("flat-npy-header-dtype-unparseable", "fast", "FormatError")
def _(tmp: Path) -> Path:
    path = tmp / "shards"
    path.mkdir()
    raw = io.BytesIO()
    np.save(raw, np.arange(10, dtype="<u2"))
    (path / "shard_0.npy").write_bytes(raw.getvalue().replace(b"'<u2'", b"',u2'"))
    return path


@bad("flat-npy-truncated", "fast", "ChecksumError", "TruncatedError", "FormatError")
def _(tmp: Path) -> Path:
    path = copy("flat", tmp)
    truncate(first(path, "*.npy"))
    return path


@bad("raw-bin-shards-without-dtype-or-metadata", "fast", "FormatError")
def _(tmp: Path) -> Path:
    path = tmp / "raw"
    path.mkdir()
    np.arange(11, dtype="<u2").tofile(path / "part_0.bin")
    np.arange(11, dtype="<u2").tofile(path / "part_1.bin")
    return path


@bad("megatron-bad-magic", "fast")
def _(tmp: Path) -> Path:
    path = copy("megatron", tmp)
    raw = bytearray((path / "data.idx").read_bytes())
    raw[0:4] = b"XXXX"
    (path / "data.idx").write_bytes(bytes(raw))
    return path


@bad("megatron-truncated-bin", "fast", "TruncatedError")
def _(tmp: Path) -> Path:
    path = copy("megatron", tmp)
    truncate(path / "data.bin")
    return path


@bad("packed-truncated", "fast", "TruncatedError", "FormatError", "IndexCorruptError")
def _(tmp: Path) -> Path:
    path = copy("data.pbin", tmp)
    truncate(path, keep=len(path.read_bytes()) - 5)
    return path


@bad("packed-unsafe-pickle-index", "fast", "UnsafeFormatError", "FormatError")
def _(tmp: Path) -> Path:
    import pickle

    path = copy("data.pbin", tmp)
    raw = path.read_bytes()
    data_len = struct.unpack_from("<Q", raw, 0)[0]
    evil = pickle.dumps(os.system)  # never executed: the index is parsed with an allow-list
    path.write_bytes(raw[: 12 + data_len] + evil)  # the current layout: 12-byte header, data, index
    return path


@bad("h5-not-hdf5", "fast", "FormatError")
def _(tmp: Path) -> Path:
    (tmp / "store.h5").write_bytes(b"this is not an HDF5 file" * 10)
    return tmp / "store.h5"


@bad("bin-meta-json-corrupt", "fast", "FormatError")
def _(tmp: Path) -> Path:
    path = copy("store-bin", tmp)
    (path / "meta.json").write_text('{"sequence": {"shape": [')
    return path


@bad("bin-meta-key-file-missing", "fast", "MissingFileError", "FormatError")
def _(tmp: Path) -> Path:
    path = copy("store-bin", tmp)
    (path / "sequence.bin").unlink()
    return path


@bad("tatm-yaml-tag", "fast", "FormatError")
def _(tmp: Path) -> Path:
    path = copy("tatm", tmp)
    text = (path / "metadata.yaml").read_text().replace("dtype: uint16", "dtype: !!python/name:os.system uint16")
    (path / "metadata.yaml").write_text(text)
    return path


@bad("gpt-simple-offsets-not-monotone", "fast", "IndexCorruptError")
def _(tmp: Path) -> Path:
    path = copy("gpt-simple", tmp)
    idx = path / "shard_00000.idx"
    raw = bytearray(idx.read_bytes())
    struct.pack_into("<q", raw, 16 + 8 * 2, 1)
    idx.write_bytes(bytes(raw))
    return path


@bad("gpt-simple-unknown-dtype-code", "fast", "FormatError")
def _(tmp: Path) -> Path:
    path = copy("gpt-simple", tmp)
    idx = path / "shard_00000.idx"
    raw = bytearray(idx.read_bytes())
    struct.pack_into("<I", raw, 8, 9)
    idx.write_bytes(bytes(raw))
    return path


@bad("gpt-simple-token-bytes-short", "fast", "TruncatedError", "IndexCorruptError")
def _(tmp: Path) -> Path:
    path = copy("gpt-simple", tmp)
    truncate(path / "shard_00000.bin", keep=len((path / "shard_00000.bin").read_bytes()) - 2)
    return path


def _dataset_commands(tmp: Path, path: Path) -> dict[str, tuple[Run, str]]:
    """command name -> (run, its validation level)."""
    from tokenloom.formats import open_dataset

    def read_all(level: str) -> Callable[[], int]:
        def call() -> int:
            ds = open_dataset(path, validate=level)
            return sum(int(ds[i].sum()) for i in range(len(ds)))

        return call

    src = [path] if path.exists() else []
    return {
        "validate": (Run(argv=["validate", str(path)], sources=src), "fast"),
        "validate-deep": (Run(argv=["validate", str(path), "--deep"], sources=src), "deep"),
        "inspect": (Run(argv=["inspect", str(path)], sources=src), "fast"),
        "inspect-json": (Run(argv=["inspect", str(path), "--json"], sources=src), "fast"),
        "convert-native": (
            Run(argv=["convert", str(path), str(tmp / "out"), "--to", "native", "--no-progress"], sources=src),
            "convert",
        ),
        "convert-megatron": (
            Run(argv=["convert", str(path), str(tmp / "out" / "data"), "--to", "megatron", "--no-progress"], sources=src),
            "convert",
        ),
        "open_dataset": (Run(call=read_all("fast"), sources=src), "fast"),
        "open_dataset-deep": (Run(call=read_all("deep"), sources=src), "deep"),
    }


def _register_dataset_cross_product() -> None:
    commands = ["validate", "validate-deep", "inspect", "inspect-json", "convert-native", "convert-megatron"]
    commands += ["open_dataset", "open_dataset-deep"]
    for bad_name, (build, detected, errors) in BAD_DATASETS.items():
        for command in commands:

            def setup(tmp: Path, build=build, command=command) -> Run:
                return _dataset_commands(tmp, build(tmp))[command][0]

            level = {"validate-deep": "deep", "open_dataset-deep": "deep"}.get(command, "fast")
            # a corruption only deep validation sees: fast commands read it as it is (exit 0); convert reads every
            # token and must notice (a checksum is there to be checked)
            if detected == "deep" and level == "fast" and not command.startswith("convert"):
                CASES.append(Case(f"{command} {bad_name}", "datasets x commands", setup, "ok"))
            else:
                CASES.append(Case(f"{command} {bad_name}", "datasets x commands", setup, "error", tuple(errors)))


# -- bad text inputs x the commands that tokenize -------------------------------------------------------

BAD_TEXT: dict[str, tuple[Callable[[Path], tuple[Path, list[str]]], tuple[str, ...]]] = {}
"""name -> (build(tmp) -> (input dir holding one .jsonl, extra options), acceptable error classes)."""


def bad_text(name: str, *errors: str) -> Callable[[Callable[[Path], tuple[Path, list[str]]]], Any]:
    def register(build: Callable[[Path], tuple[Path, list[str]]]) -> Any:
        BAD_TEXT[name] = (build, errors)
        return build

    return register


def _jsonl(tmp: Path, lines: list[bytes], name: str = "a.jsonl") -> Path:
    directory = tmp / "in"
    directory.mkdir(exist_ok=True)
    good = [json.dumps({"text": t}).encode() for t in TEXTS[:5]]
    (directory / name).write_bytes(b"\n".join(good + lines) + b"\n")
    return directory


@bad_text("invalid-json-line", "RecordError")
def _(tmp: Path) -> tuple[Path, list[str]]:
    return _jsonl(tmp, [b'{"text": "unterminated']), []


@bad_text("record-without-text-field", "RecordError")
def _(tmp: Path) -> tuple[Path, list[str]]:
    return _jsonl(tmp, [b'{"body": "x"}']), []


@bad_text("text-not-a-string", "RecordError")
def _(tmp: Path) -> tuple[Path, list[str]]:
    return _jsonl(tmp, [b'{"text": 12}']), []


@bad_text("record-not-an-object", "RecordError")
def _(tmp: Path) -> tuple[Path, list[str]]:
    return _jsonl(tmp, [b'["text", "x"]']), []


@bad_text("invalid-utf8", "RecordError")
def _(tmp: Path) -> tuple[Path, list[str]]:
    return _jsonl(tmp, [b'{"text": "caf\xe9"}']), []


@bad_text("nested-text-field-absent", "RecordError")
def _(tmp: Path) -> tuple[Path, list[str]]:
    return _jsonl(tmp, []), ["--text-field", "meta.body"]


@bad_text("corrupt-gzip", "RecordError", "FormatError", "StorageError")
def _(tmp: Path) -> tuple[Path, list[str]]:
    directory = tmp / "in"
    directory.mkdir()
    (directory / "a.jsonl.gz").write_bytes(b"\x1f\x8b\x08\x00" + b"not gzip at all" * 20)
    return directory, []


@bad_text("fifo-named-jsonl", "UnsafePathError", "StorageError")
def _(tmp: Path) -> tuple[Path, list[str]]:
    directory = _jsonl(tmp, [])
    os.mkfifo(directory / "b.jsonl")
    return directory, []


@bad_text("symlink-loop-named-jsonl", "StorageError", "UnsafePathError", "ConfigError")
def _(tmp: Path) -> tuple[Path, list[str]]:
    directory = _jsonl(tmp, [])
    (directory / "b.jsonl").symlink_to(directory / "c.jsonl")
    (directory / "c.jsonl").symlink_to(directory / "b.jsonl")
    return directory, []


@bad_text("corrupt-tokenizer-json", "FormatError", "ConfigError")
def _(tmp: Path) -> tuple[Path, list[str]]:
    tokenizer = tmp / "tok"
    shutil.copytree(_tokenizer(), tokenizer)
    (tokenizer / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    return _jsonl(tmp, []), ["--tokenizer", str(tokenizer)]


@bad_text("tokenizer-directory-missing", "ConfigError", "MissingFileError")
def _(tmp: Path) -> tuple[Path, list[str]]:
    return _jsonl(tmp, []), ["--tokenizer", str(tmp / "no-such-tokenizer")]


@bad_text("tokenizer-without-eos", "ConfigError")
def _(tmp: Path) -> tuple[Path, list[str]]:
    tokenizer = tmp / "tok"
    shutil.copytree(_tokenizer(), tokenizer)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        file = tokenizer / name
        if file.is_file():
            data = json.loads(file.read_text())
            data.pop("eos_token", None)
            file.write_text(json.dumps(data))
    return _jsonl(tmp, []), ["--tokenizer", str(tokenizer)]


@bad_text("eos-id-outside-vocabulary", "ConfigError", "TokenRangeError")
def _(tmp: Path) -> tuple[Path, list[str]]:
    return _jsonl(tmp, []), ["--eos-id", "99999999"]


@bad_text("json-array-file", "RecordError", "FormatError")
def _(tmp: Path) -> tuple[Path, list[str]]:
    directory = tmp / "in"
    directory.mkdir()
    (directory / "a.jsonl").write_text(json.dumps([{"text": t} for t in TEXTS[:4]], indent=2))
    return directory, []


@bad_text("unreadable-bytes-nul", "RecordError")
def _(tmp: Path) -> tuple[Path, list[str]]:
    return _jsonl(tmp, [b"\x00\x00\x00\x00"]), []


def _text_commands(tmp: Path, directory: Path, extra: list[str]) -> dict[str, Run]:
    files = sorted(directory.iterdir())
    src = [directory]
    tok = ["--tokenizer", str(_tokenizer())] if "--tokenizer" not in extra else []
    common = [*tok, *extra]
    pack_extra = [a for a in common]
    eval_files = [a for f in files for a in ("--data-files", str(f))]
    return {
        "tokenize": Run(
            argv=["tokenize", "--input-dir", str(directory), "--output-dir", str(tmp / "out"), "--num-workers", "0",
                  "--no-progress", *common],
            sources=src,
        ),  # fmt: skip
        "tokenize-megatron": Run(
            argv=["tokenize", "--input-dir", str(directory), "--output-dir", str(tmp / "out"), "--num-workers", "0",
                  "--no-progress", "--format", "megatron", *common],
            sources=src,
        ),  # fmt: skip
        "pack": Run(
            argv=["pack", str(files[-1]), "--output", str(tmp / "out.pbin"), "--num-workers", "0", "--no-progress",
                  *pack_extra],
            sources=src,
        ),  # fmt: skip
        "eval-cache": Run(
            argv=["eval-cache", *eval_files, "--seq-len", "8", "--cache-dir", str(tmp / "cache"), "--no-progress",
                  *[a for a in common if a != "--eos-id" and not a.isdigit()]],
            sources=src,
        ),  # fmt: skip
    }


def _register_text_cross_product() -> None:
    for bad_name, (build, errors) in BAD_TEXT.items():
        for command in ("tokenize", "tokenize-megatron", "pack", "eval-cache"):
            if command == "eval-cache" and bad_name in ("eos-id-outside-vocabulary", "nested-text-field-absent"):
                continue  # eval-cache has neither option
            if command == "eval-cache" and bad_name == "json-array-file":
                continue  # load_dataset("json") reads a JSON array file: a correct result, not bad input there
            if command == "pack" and bad_name == "fifo-named-jsonl":
                continue  # pack's own input is the good file; the FIFO case for pack is below

            def setup(tmp: Path, build=build, command=command) -> Run:
                directory, extra = build(tmp)
                return _text_commands(tmp, directory, extra)[command]

            # eval-cache parses through load_dataset: its parser errors arrive as EvalBuildError, with their cause
            accepted = (*errors, "EvalBuildError") if command == "eval-cache" else errors
            CASES.append(Case(f"{command} {bad_name}", "text x commands", setup, "error", tuple(accepted)))


# -- the "Why" list ----------------------------------------------------------------------------


def _unchanged_and_absent(target: Path) -> Callable[[Outcome], str | None]:
    def check(_outcome: Outcome) -> str | None:
        return f"{target} was created" if target.exists() else None

    return check


@case("convert SRC SRC --to native --overwrite", "data loss", "error", "ConfigError", "UnsafePathError")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    return Run(argv=["convert", str(src), str(src), "--to", "native", "--overwrite", "--no-progress"], sources=[src])


@case("convert SRC SRC --to flat --overwrite", "data loss", "error", "ConfigError", "UnsafePathError")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    return Run(argv=["convert", str(src), str(src), "--to", "flat", "--overwrite", "--no-progress"], sources=[src])


@case("convert megatron prefix onto itself --overwrite", "data loss", "error", "ConfigError", "UnsafePathError")
def _(tmp: Path) -> Run:
    src = copy("megatron", tmp)
    argv = ["convert", str(src / "data"), str(src / "data"), "--to", "megatron", "--overwrite", "--no-progress"]
    return Run(argv=argv, sources=[src])


@case("convert SRC SRC/inside --overwrite (target inside source)", "data loss", "error", "ConfigError", "UnsafePathError")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    return Run(argv=["convert", str(src), str(src / "in"), "--to", "native", "--overwrite", "--no-progress"], sources=[src])


@case("convert SRC PARENT --overwrite (target contains source)", "data loss", "error", "ConfigError", "UnsafePathError")
def _(tmp: Path) -> Run:
    (tmp / "parent").mkdir()
    src = copy("native", tmp / "parent")
    argv = ["convert", str(src), str(tmp / "parent"), "--to", "native", "--overwrite", "--no-progress"]
    return Run(argv=argv, sources=[src])


@case("convert SRC LINK-TO-SRC --overwrite (symlink)", "data loss", "error", "ConfigError", "UnsafePathError")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    (tmp / "link").symlink_to(src)
    return Run(argv=["convert", str(src), str(tmp / "link"), "--to", "native", "--overwrite", "--no-progress"], sources=[src])


@case("convert onto a directory of user files --overwrite", "data loss", "error", "ConfigError")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    (tmp / "mine").mkdir()
    (tmp / "mine" / "thesis.tex").write_text("precious")
    argv = ["convert", str(src), str(tmp / "mine"), "--to", "native", "--overwrite", "--no-progress"]
    return Run(argv=argv, sources=[src, tmp / "mine"])


@case("convert onto a tokenloom dataset --overwrite replaces it", "data loss", "ok")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    shutil.copytree(VALID / "flat", tmp / "old")
    argv = ["convert", str(src), str(tmp / "old"), "--to", "native", "--overwrite", "--no-progress"]

    def check(_o: Outcome) -> str | None:
        from tokenloom.formats import open_dataset

        a, b = open_dataset(src, validate="deep"), open_dataset(tmp / "old", validate="deep")
        same = [a[i].tolist() for i in range(len(a))] == [b[i].tolist() for i in range(len(b))]
        return None if same and b.format == "native" else "the replaced dataset differs from the source"

    return Run(argv=argv, sources=[src], check=check)


@case("tokenize --input-dir D --output-dir D --overwrite", "data loss", "error", "ConfigError", "UnsafePathError")
def _(tmp: Path) -> Run:
    corpus = copy("corpus", tmp)
    argv = ["tokenize", "--input-dir", str(corpus), "--output-dir", str(corpus), "--overwrite", "--num-workers", "0",
            "--no-progress"]  # fmt: skip
    return Run(argv=argv, sources=[corpus])


@case("tokenize --output-dir = the tokenizer directory --overwrite", "data loss", "error", "ConfigError", "UnsafePathError")
def _(tmp: Path) -> Run:
    corpus = copy("corpus", tmp)
    tok = tmp / "tok"
    shutil.copytree(_tokenizer(), tok)
    argv = ["tokenize", "--input-dir", str(corpus), "--output-dir", str(tok), "--tokenizer", str(tok), "--overwrite",
            "--num-workers", "0", "--no-progress"]  # fmt: skip
    return Run(argv=argv, sources=[corpus, tok])


@case("tokenize --output-dir PARENT-of-input --overwrite", "data loss", "error", "ConfigError", "UnsafePathError")
def _(tmp: Path) -> Run:
    (tmp / "work").mkdir()
    corpus = copy("corpus", tmp / "work")
    argv = ["tokenize", "--input-dir", str(corpus), "--output-dir", str(tmp / "work"), "--overwrite",
            "--num-workers", "0", "--no-progress"]  # fmt: skip
    return Run(argv=argv, sources=[corpus])


@case("tokenize onto a directory of user files --overwrite", "data loss", "error", "ConfigError")
def _(tmp: Path) -> Run:
    corpus = copy("corpus", tmp)
    (tmp / "mine").mkdir()
    (tmp / "mine" / "notes.txt").write_text("precious")
    argv = ["tokenize", "--input-dir", str(corpus), "--output-dir", str(tmp / "mine"), "--overwrite",
            "--num-workers", "0", "--no-progress"]  # fmt: skip
    return Run(argv=argv, sources=[corpus, tmp / "mine"])


@case("pack INPUT --output INPUT --overwrite", "data loss", "error", "ConfigError", "UnsafePathError")
def _(tmp: Path) -> Run:
    corpus = copy("corpus", tmp)
    target = corpus / "a.jsonl"
    return Run(argv=["pack", str(target), "--output", str(target), "--overwrite", "--no-progress"], sources=[corpus])


@case("eval-cache --cache-dir = the dataset --path", "data loss", "error", "ConfigError", "UnsafePathError")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    return Run(argv=["eval-cache", "--path", str(src), "--seq-len", "8", "--cache-dir", str(src), "--no-progress"],
               sources=[src])  # fmt: skip


# OS failures: real mounts / dropped capabilities in a real process where possible


def _can_mount() -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    point = Path(tempfile.mkdtemp(prefix="mnt-probe-", dir=BASE))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(point)], capture_output=True)
    if done.returncode == 0:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)
    return done.returncode == 0


MOUNT_OK: bool | None = None


def _mount(point: Path, options: str) -> Callable[[], None]:
    point.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], check=True, capture_output=True)
    return lambda: subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=30) and None


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tokenloom.formats", *args]


def _no_dac(command: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all", *command]
    return command


def _simulated(code: int, command: list[str], where: str) -> list[str]:
    """``command`` with an OSError(code) raised by the first write below ``where`` (when a mount is impossible)."""
    shim = (
        "import builtins, errno, os, sys\n"
        f"where, code = {str(where)!r}, {code}\n"
        "real_open = os.open\n"
        "def fake(path, flags, *a, **k):\n"
        "    if str(os.fspath(path)).startswith(where) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):\n"
        "        raise OSError(code, os.strerror(code), os.fspath(path))\n"
        "    return real_open(path, flags, *a, **k)\n"
        "os.open = fake\n"
        "real_mkdir = os.mkdir\n"
        "def fake_mkdir(path, *a, **k):\n"
        "    if str(os.fspath(path)).startswith(where):\n"
        "        raise OSError(code, os.strerror(code), os.fspath(path))\n"
        "    return real_mkdir(path, *a, **k)\n"
        "os.mkdir = fake_mkdir\n"
        "from tokenloom.formats._cli import main\n"
        f"sys.argv = ['tokenloom', *{command[3:]!r}]\n"
        "main(prog_name='tokenloom')\n"
    )
    return [sys.executable, "-c", shim]


def _os_case(name: str, code: int, make: Callable[[Path, Path], list[str]], *errors: str) -> None:
    """A command whose output (or input) hits ``code``: a real mount/capability drop, else simulated."""

    def setup(tmp: Path) -> Run:
        mounted = MOUNT_OK
        point = tmp / "mnt"
        cleanup = None
        if code in (errno.EROFS, errno.ENOSPC) and mounted:
            cleanup = _mount(point, "size=64k,ro" if code == errno.EROFS else "size=16k")
            if code == errno.ENOSPC:
                (point / "ballast").write_bytes(b"\0" * 12 * 1024)
        else:
            point.mkdir()
        command = make(tmp, point)
        if code in (errno.EROFS, errno.ENOSPC) and not mounted:
            command = _simulated(code, command, str(point))
        sources = [p for p in tmp.iterdir() if p.name != "mnt"]
        return Run(process=command, sources=sources, cleanup=cleanup)

    CASES.append(Case(name, "OS failures", setup, "error", tuple(errors)))


def _big_corpus(tmp: Path) -> Path:
    corpus = tmp / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text("".join(json.dumps({"text": t * 20}) + "\n" for t in TEXTS * 5))
    return corpus


def _register_os_cases() -> None:
    tok = str(_tokenizer())
    for code, label in ((errno.EROFS, "read-only output (EROFS)"), (errno.ENOSPC, "full disk (ENOSPC)")):
        _os_case(
            f"tokenize onto a {label}",
            code,
            lambda tmp, mnt: _cli("tokenize", "--input-dir", str(_big_corpus(tmp)), "--output-dir", str(mnt / "out"),
                                  "--tokenizer", tok, "--num-workers", "0", "--no-progress"),  # fmt: skip
            "StorageError",
        )
        _os_case(
            f"convert onto a {label}",
            code,
            lambda tmp, mnt: _cli("convert", str(_big_native(tmp)), str(mnt / "out"), "--to", "native", "--no-progress"),
            "StorageError",
        )
        _os_case(
            f"convert --to megatron onto a {label}",
            code,
            lambda tmp, mnt: _cli("convert", str(_big_native(tmp)), str(mnt / "out" / "data"), "--to", "megatron",
                                  "--no-progress"),  # fmt: skip
            "StorageError",
        )
        _os_case(
            f"pack onto a {label}",
            code,
            lambda tmp, mnt: _cli("pack", str(_big_corpus(tmp) / "a.jsonl"), "--output", str(mnt / "a.pbin"),
                                  "--tokenizer", tok, "--num-workers", "0", "--no-progress"),  # fmt: skip
            "StorageError",
        )
        _os_case(
            f"index onto a {label}",
            code,
            lambda tmp, mnt: _index_on_mount(tmp, mnt),
            "StorageError",
        )

    def unreadable(kind: str, make: Callable[[Path], list[str]], *errors: str) -> None:
        def setup(tmp: Path) -> Run:
            command = make(tmp)
            sources = list(tmp.iterdir())
            return Run(process=_no_dac(command), sources=sources)

        CASES.append(Case(f"{kind} (EACCES)", "OS failures", setup, "error", tuple(errors or ("StorageError",))))

    def chmod0(path: Path) -> Path:
        path.chmod(0)
        return path

    unreadable(
        "tokenize an unreadable input file",
        lambda tmp: _cli("tokenize", "--input-dir", str(_chmod_in(copy("corpus", tmp), "a.jsonl")), "--output-dir",
                         str(tmp / "out"), "--tokenizer", tok, "--num-workers", "0", "--no-progress"),  # fmt: skip
    )
    unreadable(
        "convert an unreadable shard",
        lambda tmp: _cli("convert", str(_chmod_in(copy("native", tmp), "shard_00000.bin")), str(tmp / "out"),
                         "--to", "native", "--no-progress"),  # fmt: skip
    )
    unreadable(
        "validate (fast) an unreadable shard",
        lambda tmp: _cli("validate", str(_chmod_in(copy("native", tmp), "shard_00000.bin"))),
    )
    unreadable(
        "inspect an unreadable manifest",
        lambda tmp: _cli("inspect", str(_chmod_in(copy("native", tmp), "manifest.json"))),
    )
    unreadable(
        "open_dataset + read an unreadable shard (Python)",
        lambda tmp: [sys.executable, "-c", _PY_READ.format(path=str(_chmod_in(copy("native", tmp), "shard_00000.bin")))],
    )
    unreadable(
        "tokenize into an output directory without write permission",
        lambda tmp: _cli("tokenize", "--input-dir", str(copy("corpus", tmp)), "--output-dir",
                         str(chmod0(_mkdir(tmp / "locked")) / "out"), "--tokenizer", tok, "--num-workers", "0",
                         "--no-progress"),  # fmt: skip
    )
    unreadable(
        "convert into an output directory without write permission",
        lambda tmp: _cli("convert", str(copy("native", tmp)), str(chmod0(_mkdir(tmp / "locked")) / "out"), "--to",
                         "native", "--no-progress"),  # fmt: skip
    )
    unreadable(
        "PackedDocumentDataset over an unreadable shard (Python)",
        lambda tmp: [sys.executable, "-c", _PY_PACKED.format(path=str(_chmod_in(copy("native", tmp), "shard_00000.bin")))],
    )


_PY_READ = """
from tokenloom.formats import DataError, open_dataset
try:
    ds = open_dataset({path!r})
    sum(int(ds[i].sum()) for i in range(len(ds)))
except DataError as exc:
    raise SystemExit(f"Error: {{type(exc).__name__}}: {{exc}}")
"""
_PY_PACKED = """
from tokenloom.formats import DataError
from tokenloom.datasets import PackedDocumentDataset
try:
    ds = PackedDocumentDataset({path!r}, 8)
    [ds[i] for i in range(len(ds))]
except DataError as exc:
    raise SystemExit(f"Error: {{type(exc).__name__}}: {{exc}}")
"""


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def _chmod_in(directory: Path, name: str) -> Path:
    (directory / name).chmod(0)
    return directory


def _big_native(tmp: Path) -> Path:
    target = tmp / "big"
    rng = np.random.default_rng(1)
    with open_writer(target, format="native", dtype="uint16", vocab_size=256, eos_id=0) as w:
        for _ in range(200):
            w.add(np.append(rng.integers(1, 250, 200), 0))
    return target


def _index_on_mount(tmp: Path, mnt: Path) -> list[str]:
    """The jsonl lives on the mount (the index is written beside it): copied before the mount turns read-only."""
    corpus = copy("corpus", tmp)
    return _cli("index", str(_onto(corpus / "a.jsonl", mnt)))


def _onto(file: Path, mnt: Path) -> Path:
    """For EROFS/ENOSPC of ``index``: a read-only mount cannot receive the file, so it is bind-free: remount."""
    if not MOUNT_OK:
        target = mnt / file.name
        shutil.copy(file, target)
        return target
    # the mount is there already (read-only or almost full): remount writable, copy, restore the options
    options = subprocess.run(["findmnt", "-no", "OPTIONS", str(mnt)], capture_output=True, text=True).stdout
    subprocess.run(["mount", "-o", "remount,rw", str(mnt)], check=True, capture_output=True)
    (mnt / "ballast").unlink(missing_ok=True)
    shutil.copy(file, mnt / file.name)
    if "ro" in options.split(","):
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True, capture_output=True)
    else:
        with contextlib.suppress(OSError), open(mnt / "ballast", "wb") as ballast:
            while True:  # to the last byte
                ballast.write(b"\0" * 512)
                ballast.flush()
    return mnt / file.name


# -- writer lock, caches, missing extra, silent cases, the newcomer's trap, friction ---------------------


@case("two tokenize runs into one output: the second names the holder", "concurrency", "error", "OutputLockedError")
def _(tmp: Path) -> Run:
    corpus = copy("corpus", tmp)
    out = tmp / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom tokenloom.formats import output_lock\n"
         f"with output_lock({str(out)!r}, what='first run'):\n    print('held', flush=True)\n    time.sleep(60)\n"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert holder.stdout is not None
    holder.stdout.readline()
    command = _cli("tokenize", "--input-dir", str(corpus), "--output-dir", str(out), "--tokenizer", str(_tokenizer()),
                   "--num-workers", "0", "--no-progress")  # fmt: skip

    def check(outcome: Outcome) -> str | None:
        return None if str(holder.pid) in outcome.stderr else "the error does not name the holder's pid"

    return Run(process=command, sources=[corpus], check=check, cleanup=lambda: (holder.kill(), holder.wait()) and None)


@case("two convert runs into one output: the second names the holder", "concurrency", "error", "OutputLockedError")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    out = tmp / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time\nfrom tokenloom.formats import output_lock\n"
         f"with output_lock({str(out)!r}, what='first run'):\n    print('held', flush=True)\n    time.sleep(60)\n"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert holder.stdout is not None
    holder.stdout.readline()
    command = _cli("convert", str(src), str(out), "--to", "native", "--no-progress")
    return Run(process=command, sources=[src], cleanup=lambda: (holder.kill(), holder.wait()) and None)


@case("a stale lock (dead pid) is taken over with a warning", "concurrency", "ok")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    out = tmp / "out"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock = {"pid": int(dead.stdout), "host": socket.gethostname(), "started": "2020-01-01T00:00:00Z",
            "process_start": 1, "command": "killed"}  # fmt: skip
    (tmp / "out.tokenloom-lock").write_text(json.dumps(lock))

    def check(outcome: Outcome) -> str | None:
        return None if "stale" in outcome.stderr.lower() else "no warning about the stale lock"

    return Run(argv=["convert", str(src), str(out), "--to", "native", "--no-progress"], sources=[src], check=check)


def _plan_dataset(tmp: Path) -> tuple[Any, Path]:
    from tokenloom.datasets import PackedDocumentDataset

    src = copy("native", tmp)
    return (lambda: PackedDocumentDataset(src, 16, cache_dir=tmp / "plans")), src


def _rows(ds: Any) -> list[list[int]]:
    return [ds[i]["input_ids"].tolist() for i in range(len(ds))]


@case("truncated packing-plan cache is detected and rebuilt", "caches", "ok")
def _(tmp: Path) -> Run:
    make, src = _plan_dataset(tmp)
    expected = _rows(make())
    plan = next((tmp / "plans").rglob("token_start.npy"))
    truncate(plan)

    def call() -> Any:
        with _captured_log("tokenloom.datasets") as log:
            rows = _rows(make())
        return rows, log.getvalue()

    def check(outcome: Outcome) -> str | None:
        rows, log = outcome.value
        if rows != expected:
            return "samples differ after the rebuild"
        return None if "damaged" in log else "the damage was not logged"

    return Run(call=call, sources=[src], check=check)


@case("byte flip in the packing-plan cache is detected and rebuilt", "caches", "ok")
def _(tmp: Path) -> Run:
    make, src = _plan_dataset(tmp)
    expected = _rows(make())
    flip(next((tmp / "plans").rglob("length.npy")), at=-1)

    def call() -> Any:
        with _captured_log("tokenloom.datasets") as log:
            rows = _rows(make())
        return rows, log.getvalue()

    return Run(call=call, sources=[src], check=lambda o: None if o.value[0] == expected and "damaged" in o.value[1]
               else "not detected or samples differ")  # fmt: skip


@case("plan cache directory read-only: in-memory plan with a warning", "caches", "ok")
def _(tmp: Path) -> Run:
    make, src = _plan_dataset(tmp)
    (tmp / "plans").mkdir()
    command = [sys.executable, "-c", "import logging, sys\nlogging.basicConfig(level=logging.WARNING)\n"
               "from tokenloom.datasets import PackedDocumentDataset\n"
               f"ds = PackedDocumentDataset({str(src)!r}, 16, cache_dir={str(tmp / 'plans')!r})\n"
               "assert ds.plan_in_memory\nprint(len(ds), [ds[i]['input_ids'].tolist() for i in range(len(ds))])\n"]  # fmt: skip
    expected = _rows(__import__("tokenloom.datasets", fromlist=["x"]).PackedDocumentDataset(src, 16))
    if MOUNT_OK:
        cleanup = _mount(tmp / "plans", "size=64k,ro")
    else:
        (tmp / "plans").chmod(0o555)
        command, cleanup = _no_dac(command), None

    def check(outcome: Outcome) -> str | None:
        if str(expected) not in outcome.stdout:
            return "samples differ from a plan built in memory"
        return None if "memory" in outcome.stderr else "no warning about the in-memory fallback"

    return Run(process=command, sources=[src], check=check, cleanup=cleanup)


@case("HF cache: byte flip in the middle of a cache shard is detected and rebuilt", "caches", "ok")
def _(tmp: Path) -> Run:
    from tokenloom.datasets import HuggingFaceDataset

    corpus = copy("corpus", tmp)
    kwargs = {"data_files": str(corpus / "a.jsonl"), "seq_len": 8, "tokenizer": str(_tokenizer())}
    first_ds = HuggingFaceDataset("json", cache_dir=tmp / "c", **kwargs)
    expected = _rows(first_ds)
    shard = next(first_ds.cache_path.glob("*.bin"))
    flip(shard)

    def call() -> Any:
        with _captured_log("tokenloom.datasets") as log:
            rows = _rows(HuggingFaceDataset("json", cache_dir=tmp / "c", **kwargs))
        return rows, log.getvalue()

    return Run(call=call, sources=[corpus], check=lambda o: None if o.value[0] == expected and "damaged" in o.value[1]
               else f"not detected or samples differ (log: {o.value[1].strip()[:120]!r})")  # fmt: skip


@case("HF cache: truncated cache shard is detected and rebuilt", "caches", "ok")
def _(tmp: Path) -> Run:
    from tokenloom.datasets import HuggingFaceDataset

    corpus = copy("corpus", tmp)
    kwargs = {"data_files": str(corpus / "a.jsonl"), "seq_len": 8, "tokenizer": str(_tokenizer())}
    first_ds = HuggingFaceDataset("json", cache_dir=tmp / "c", **kwargs)
    expected = _rows(first_ds)
    truncate(next(first_ds.cache_path.glob("*.bin")))

    def call() -> Any:
        with _captured_log("tokenloom.datasets") as log:
            rows = _rows(HuggingFaceDataset("json", cache_dir=tmp / "c", **kwargs))
        return rows, log.getvalue()

    return Run(call=call, sources=[corpus], check=lambda o: None if o.value[0] == expected and "damaged" in o.value[1]
               else "not detected or samples differ")  # fmt: skip


@contextlib.contextmanager
def _captured_log(name: str) -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger(name)
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


@case("convert --to h5 with the h5 extra missing", "missing extra", "extra")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    shim = ("import sys\nsys.modules['h5py'] = None\nfrom tokenloom.formats._cli import main\n"
            f"sys.argv = ['tokenloom', 'convert', {str(src)!r}, {str(tmp / 'x.h5')!r}, '--to', 'h5', '--no-progress']\n"
            "main(prog_name='tokenloom')\n")  # fmt: skip
    return Run(process=[sys.executable, "-c", shim], sources=[src])


@case("inspect --plot with matplotlib missing", "missing extra", "extra")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    shim = ("import sys\nsys.modules['matplotlib'] = None\nfrom tokenloom.formats._cli import main\n"
            f"sys.argv = ['tokenloom', 'inspect', {str(src)!r}, '--plot', {str(tmp / 'p.png')!r}]\n"
            "main(prog_name='tokenloom')\n")  # fmt: skip
    return Run(process=[sys.executable, "-c", shim], sources=[src])


@case("validate: extra shard file beside a manifest is a warning", "silent", "ok")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    shutil.copy(first(src, "*.bin"), src / "shard_00099.bin")
    return Run(argv=["validate", str(src)], sources=[src],
               check=lambda o: None if "warning" in o.stdout and "shard_00099.bin" in o.stdout else "no warning")  # fmt: skip


@case("open_dataset: extra shard file beside a manifest is logged", "silent", "ok")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    src = copy("native", tmp)
    shutil.copy(first(src, "*.bin"), src / "shard_00099.bin")

    def call() -> str:
        with _captured_log("tokenloom.formats") as log:
            open_dataset(src)
        return log.getvalue()

    return Run(call=call, sources=[src], check=lambda o: None if "shard_00099.bin" in o.value else "not logged")


@case("sampler state from another dataset of the same length", "silent", "error", "ResumeMismatchError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset
    from tokenloom.sampler import ResumableDistributedSampler

    a = copy("native", tmp)
    b = tmp / "b"
    with open_writer(b, format="native", dtype="uint16", vocab_size=256, eos_id=0) as w:
        for doc in _docs():
            w.add(doc[::-1].copy())
    state = ResumableDistributedSampler(open_dataset(a), 1, 0).state_dict()
    other = ResumableDistributedSampler(open_dataset(b), 1, 0)
    return Run(call=lambda: other.load_state_dict(state), sources=[a, b])


@case("sampler state with epoch 10**30", "silent", "error", "ConfigError", "ResumeMismatchError")
def _(tmp: Path) -> Run:
    from tokenloom.sampler import ResumableDistributedSampler

    sampler = ResumableDistributedSampler(100, 1, 0)
    state = sampler.state_dict()
    state["epoch"] = 10**30
    return Run(call=lambda: sampler.load_state_dict(state))


@case("sampler set_epoch(-1)", "silent", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.sampler import ResumableDistributedSampler

    return Run(call=lambda: ResumableDistributedSampler(100, 1, 0).set_epoch(-1))


@case("validate --deep megatron says what it could not check", "silent", "ok")
def _(tmp: Path) -> Run:
    src = copy("megatron", tmp)
    return Run(argv=["validate", str(src), "--deep"], sources=[src],
               check=lambda o: None if "token range not checked" in o.stdout else "claims a full check")  # fmt: skip


@case("validate --deep megatron --vocab-size 100 finds ids >= 100", "silent", "error", "TokenRangeError")
def _(tmp: Path) -> Run:
    src = copy("megatron", tmp)
    return Run(argv=["validate", str(src), "--deep", "--vocab-size", "100"], sources=[src])


@case("JsonlIndex: file rewritten with the same size and mtime is re-indexed", "silent", "ok")
def _(tmp: Path) -> Run:
    from tokenloom.tokenize.jsonl_index import JsonlIndex

    path = tmp / "a.jsonl"
    path.write_text('{"text": "aaaa"}\n{"text": "b"}\n')
    JsonlIndex(path)
    stat = path.stat()
    path.write_text('{"text": "a"}\n{"text": "bbbb"}\n')
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))

    def call() -> list[bytes]:
        index = JsonlIndex(path)
        return [bytes(index.raw(i)) for i in range(len(index))]

    return Run(call=call, check=lambda o: None if o.value[1].strip() == b'{"text": "bbbb"}' else f"stale: {o.value}")


@case("tokenize without EOS, then the advised rerun with --eos-id", "newcomer", "ok")
def _(tmp: Path) -> Run:
    corpus = copy("corpus", tmp)
    tokenizer = tmp / "tok"
    shutil.copytree(_tokenizer(), tokenizer)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        file = tokenizer / name
        if file.is_file():
            data = json.loads(file.read_text())
            data.pop("eos_token", None)
            file.write_text(json.dumps(data))
    args = ["tokenize", "--input-dir", str(corpus), "--output-dir", str(tmp / "out"), "--tokenizer", str(tokenizer),
            "--num-workers", "0", "--no-progress"]  # fmt: skip
    failed = CliRunner().invoke(tokenloom_main, args)

    def check(outcome: Outcome) -> str | None:
        if failed.exit_code != 1 or "--eos-id" not in failed.output:
            return f"first run: exit {failed.exit_code}, {failed.output.strip()[:100]}"
        return None

    return Run(argv=[*args, "--eos-id", "0"], sources=[corpus], check=check)


@case("tokenize with a bad --eos-id, then a corrected rerun", "newcomer", "ok")
def _(tmp: Path) -> Run:
    corpus = copy("corpus", tmp)
    args = ["tokenize", "--input-dir", str(corpus), "--output-dir", str(tmp / "out"), "--num-workers", "0",
            "--no-progress"]  # fmt: skip
    failed = CliRunner().invoke(tokenloom_main, [*args, "--eos-id", "99999999"])
    return Run(argv=args, sources=[corpus],
               check=lambda o: None if failed.exit_code == 1 else f"first run exit {failed.exit_code}")  # fmt: skip


@case("tokenize with a corrupt tokenizer leaves nothing, then a rerun", "newcomer", "ok")
def _(tmp: Path) -> Run:
    corpus = copy("corpus", tmp)
    tokenizer = tmp / "tok"
    shutil.copytree(_tokenizer(), tokenizer)
    good = (tokenizer / "tokenizer.json").read_bytes()
    (tokenizer / "tokenizer.json").write_text("{")
    args = ["tokenize", "--input-dir", str(corpus), "--output-dir", str(tmp / "out"), "--tokenizer", str(tokenizer),
            "--num-workers", "0", "--no-progress"]  # fmt: skip
    failed = CliRunner().invoke(tokenloom_main, args)
    left = sorted(p.name for p in (tmp / "out").iterdir()) if (tmp / "out").exists() else []
    (tokenizer / "tokenizer.json").write_bytes(good)
    return Run(argv=args, sources=[corpus],
               check=lambda o: None if failed.exit_code == 1 and not left else f"first run left {left}")  # fmt: skip


@case("tokenize with an unreadable-record input, fixed, then a rerun", "newcomer", "ok")
def _(tmp: Path) -> Run:
    corpus = copy("corpus", tmp)
    good = (corpus / "a.jsonl").read_bytes()
    (corpus / "a.jsonl").write_bytes(good + b"{broken\n")
    args = ["tokenize", "--input-dir", str(corpus), "--output-dir", str(tmp / "out"), "--num-workers", "0",
            "--no-progress"]  # fmt: skip
    failed = CliRunner().invoke(tokenloom_main, args)
    (corpus / "a.jsonl").write_bytes(good)
    return Run(argv=args, sources=[corpus],
               check=lambda o: None if failed.exit_code == 1 else f"first run exit {failed.exit_code}")  # fmt: skip


@case("pack onto an existing file: the error names --overwrite", "friction", "error", "ConfigError")
def _(tmp: Path) -> Run:
    corpus = copy("corpus", tmp)
    (tmp / "out.pbin").write_bytes(b"x")

    def check(outcome: Outcome) -> str | None:
        text = outcome.stdout + outcome.stderr
        return None if "pass --overwrite" in text else "wording is not the CLI flag"

    return Run(argv=["pack", str(corpus / "a.jsonl"), "--output", str(tmp / "out.pbin"), "--no-progress"],
               sources=[corpus, tmp / "out.pbin"], check=check)  # fmt: skip


@case("tokenize --help shows the --max-length default", "friction", "ok")
def _(tmp: Path) -> Run:
    return Run(argv=["tokenize", "--help"], check=lambda o: None if "default" in o.stdout.split("--max-length")[1][:300]
               else "no default shown")  # fmt: skip


@case("inspect --plot labels entries on a log axis", "friction", "ok")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    return Run(argv=["inspect", str(src), "--plot", str(tmp / "p.png")], sources=[src],
               check=lambda o: None if (tmp / "p.png").stat().st_size > 1000 else "no plot")  # fmt: skip


@case("validate prints entries and documents separately", "friction", "ok")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    return Run(argv=["validate", str(src)], sources=[src],
               check=lambda o: None if "entries" in o.stdout and "documents" in o.stdout else "counts unnamed")  # fmt: skip


@case("tokenize without tokenizer_config.json says why start-up is slower", "friction", "ok")
def _(tmp: Path) -> Run:
    corpus = copy("corpus", tmp)
    tokenizer = tmp / "tok"
    tokenizer.mkdir()
    shutil.copy(_tokenizer() / "tokenizer.json", tokenizer / "tokenizer.json")
    args = ["tokenize", "--input-dir", str(corpus), "--output-dir", str(tmp / "out"), "--tokenizer", str(tokenizer),
            "--num-workers", "0", "--no-progress", "--eos-id", "0"]  # fmt: skip
    return Run(argv=args, sources=[corpus],
               check=lambda o: None if "tokenizer" in o.stderr.lower() else "no start-up line names the path taken")  # fmt: skip


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
    base = {"path": str(_curriculum_corpus(tmp)), "max_length": 16, "packing": False,
            "curriculum": [{"duration_tokens": 400, "mix": {"a": 1, "b": 1}}]}  # fmt: skip
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


def _register_other_commands() -> None:
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
        "cache-dir-is-a-file": lambda t: ["--path", str(copy("native", t)), "--seq-len", "8", "--cache-dir",
                                          str(_write(t / "file", "x"))],  # fmt: skip
        "neither-path-nor-data-files": lambda t: ["--seq-len", "8", "--cache-dir", str(t / "c")],
        "data-files-missing": lambda t: ["--data-files", str(t / "none.jsonl"), "--tokenizer", str(_tokenizer()),
                                         "--seq-len", "8", "--cache-dir", str(t / "c")],  # fmt: skip
        "text-field-absent": lambda t: ["--data-files", str(copy("corpus", t) / "a.jsonl"), "--tokenizer",
                                        str(_tokenizer()), "--text-field", "body", "--seq-len", "8", "--cache-dir",
                                        str(t / "c")],  # fmt: skip
        "seq-len-larger-than-data": lambda t: ["--path", str(copy("native", t)), "--seq-len", "100000",
                                               "--cache-dir", str(t / "c"), "--drop-remainder"],  # fmt: skip
        "cache-corrupt-rebuilt-or-named": lambda t: _eval_cache_corrupt(t),
    }
    for name, make in eval_bad.items():

        def setup(tmp: Path, make=make) -> Run:
            return Run(argv=["eval-cache", *make(tmp), "--no-progress"])

        # an empty eval set is legal with a warning (documented in tokenloom-eval-broadcast)
        expect = "ok" if name in ("cache-corrupt-rebuilt-or-named", "seq-len-larger-than-data") else "error"
        CASES.append(Case(f"eval-cache {name}", "eval-cache", setup, expect))
    _register_python_readers()


def _eval_cache_corrupt(tmp: Path) -> list[str]:
    args = ["--path", str(copy("native", tmp)), "--seq-len", "8", "--cache-dir", str(tmp / "c")]
    done = CliRunner().invoke(tokenloom_main, ["eval-cache", *args, "--no-progress"])
    if done.exit_code != 0:
        raise RuntimeError(done.output)
    for file in (tmp / "c").rglob("*"):
        if file.is_file() and file.stat().st_size > 64:
            flip(file)
    return args


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _register_python_readers() -> None:
    from tokenloom.formats import open_records, open_store
    from tokenloom.tokenize.jsonl_index import JsonlIndex

    def reader(name: str, make: Callable[[Path], Callable[[], Any]], *errors: str, expect: str = "error") -> None:
        CASES.append(Case(name, "Python readers", lambda tmp: Run(call=make(tmp)), expect, tuple(errors)))

    reader("open_store missing path", lambda t: lambda: open_store(t / "none"), "MissingFileError")
    reader("open_store unknown training type", lambda t: lambda: open_store(copy("store-bin", t), training_type="x"))
    reader("open_store dpo keys absent", lambda t: lambda: open_store(copy("store-bin", t), training_type="dpo"),
           "MissingKeyError")  # fmt: skip
    reader("open_store h5 training type sft, loss_mask absent",
           lambda t: lambda: open_store(copy("store.h5", t), training_type="sft"), "MissingKeyError")  # fmt: skip
    reader("open_records on tokenloom's keyed store (per-segment offsets: one record each)",
           lambda t: lambda: len(open_records(copy("store-bin", t))), expect="ok")  # fmt: skip
    reader("open_records on a file", lambda t: lambda: open_records(copy("data.pbin", t)), "FormatError")
    reader("open_records on an empty directory", lambda t: lambda: open_records(_mkdir(t / "e")), "MissingFileError")
    reader("JsonlIndex on a missing file", lambda t: lambda: JsonlIndex(t / "none.jsonl"))
    reader("JsonlIndex on a directory", lambda t: lambda: JsonlIndex(_mkdir(t / "d.jsonl")))
    reader("JsonlIndex line out of range", lambda t: lambda: JsonlIndex(copy("corpus", t) / "a.jsonl").raw(10**6),
           expect="index")  # fmt: skip
    reader("open_dataset unknown format name", lambda t: lambda: __import__("tokenloom.formats").formats.open_dataset(
        copy("native", t), format="parquet"), "ConfigError")  # fmt: skip
    reader("open_dataset validate='paranoid'", lambda t: lambda: __import__("tokenloom.formats").formats.open_dataset(
        copy("native", t), validate="paranoid"), "ConfigError")  # fmt: skip
    reader("open_dataset option for another format", lambda t: lambda: __import__("tokenloom.formats").formats.open_dataset(
        copy("native", t), vocab_size=5), "ConfigError")  # fmt: skip
    reader("open_dataset dtype ',u2'", lambda t: lambda: __import__("tokenloom.formats").formats.open_dataset(
        copy("flat-bin", t), dtype=",u2"), "ConfigError")  # fmt: skip
    reader("PackedDocumentDataset max_length 0", lambda t: lambda: __import__(
        "tokenloom.datasets").datasets.PackedDocumentDataset(copy("native", t), 0), "ConfigError")  # fmt: skip
    reader("MemoryMappedDataset seq_len beyond the data", lambda t: lambda: _windows(copy("native", t), 10**6))


def _windows(path: Path, seq_len: int) -> Any:
    from tokenloom.datasets import MemoryMappedDataset

    ds = MemoryMappedDataset(path, seq_len)
    if len(ds) == 0:
        raise RuntimeError("an empty dataset without an error")
    return ds


# -- running ---------------------------------------------------------------------------------------------


def _digest(paths: list[Path]) -> dict[str, str]:
    found: dict[str, str] = {}
    for root in paths:
        if not root.exists() and not root.is_symlink():
            continue
        files = [root] if not root.is_dir() else sorted(p for p in root.rglob("*"))
        for path in files:
            if path.is_symlink():
                found[str(path)] = "-> " + os.readlink(path)
            elif path.is_file():
                try:
                    found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
                except PermissionError:
                    mode = path.stat().st_mode
                    path.chmod(0o600)
                    found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
                    path.chmod(mode)
            elif path.is_dir():
                found[str(path)] = "dir"
    return found


class Timeout(Exception):
    pass


def _alarm(_signum: int, _frame: Any) -> None:
    raise Timeout(f"no result within {TIMEOUT_S} s")


def execute(run: Run) -> Outcome:
    if run.argv is not None:
        result = CliRunner().invoke(tokenloom_main, run.argv, catch_exceptions=True, env=run.env)
        exception = result.exception if not isinstance(result.exception, SystemExit) else None
        stderr = result.stderr if result.stderr_bytes is not None else ""
        if exception is not None:
            stderr += "".join(traceback.format_exception(exception))
        return Outcome(result.exit_code, result.stdout, stderr, exception)
    if run.process is not None:
        env = {**os.environ, **(run.env or {})}
        done = subprocess.run(run.process, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
        return Outcome(done.returncode, done.stdout, done.stderr)
    assert run.call is not None
    try:
        return Outcome(0, value=run.call())
    except Timeout:
        raise
    except BaseException as exc:  # noqa: BLE001 - the outcome is judged below
        return Outcome(1, stderr="".join(traceback.format_exception(exc)), exception=exc)


def judge(item: Case, run: Run, outcome: Outcome) -> str | None:
    """None when the outcome is what the case expects, else the problem in a few words."""
    text = outcome.stdout + "\n" + outcome.stderr
    if run.call is not None:
        if item.expect == "index":
            return None if isinstance(outcome.exception, IndexError) else f"expected IndexError, got {outcome.exception!r}"
        if item.expect == "ok":
            if outcome.exception is not None:
                return f"raised {type(outcome.exception).__name__}: {outcome.exception}"
            return run.check(outcome) if run.check else None
        if outcome.exception is None:
            return "no error raised"
        if not isinstance(outcome.exception, DataError):
            return f"escaped {type(outcome.exception).__name__}: {str(outcome.exception)[:160]}"
        name = type(outcome.exception).__name__
        if item.error and name not in item.error:
            return f"{name} (expected {'/'.join(item.error)}): {str(outcome.exception)[:120]}"
        return run.check(outcome) if run.check else None
    if "Traceback (most recent call last)" in text:
        last = [line for line in text.strip().splitlines() if line.strip()][-1]
        return f"traceback: {last[:160]}"
    if item.expect == "ok":
        if outcome.exit_code != 0:
            return f"exit {outcome.exit_code}: {text.strip().splitlines()[-1][:160] if text.strip() else ''}"
        return run.check(outcome) if run.check else None
    if item.expect == "extra":
        lines = [line for line in outcome.stderr.strip().splitlines() if line and not line.startswith("tokenloom: ")]
        if outcome.exit_code != 2 or len(lines) != 1 or "pip install" not in lines[0]:
            return f"exit {outcome.exit_code}, {len(lines)} lines: {lines[-1][:120] if lines else ''}"
        return None
    if item.expect == "report":  # a validator: exit 1 (blocking) with its findings, or one error line
        if outcome.exit_code != 1:
            return f"exit {outcome.exit_code}, expected 1 (blocking)"
        return None if text.strip() else "exit 1 without a word"
    if outcome.exit_code not in (1, 2):
        return f"exit {outcome.exit_code}, expected 1 or 2: {text.strip()[-160:]}"
    lines = [line for line in text.splitlines() if not line.startswith("tokenloom: ")]
    named = [m.group(1) for line in lines if (m := ERROR_LINE.match(line))]
    named = [n for n in named if n in data_errors()]
    if len(named) != 1:
        if outcome.exit_code == 2 and any(line.startswith("Error: ") for line in lines) and not item.error:
            return None  # a usage error of click's (bad option value), exit 2
        return f"{len(named)} lines name a DataError: {text.strip()[-200:]}"
    if item.error and named[0] not in item.error:
        return f"{named[0]} (expected {'/'.join(item.error)})"
    return run.check(outcome) if run.check else None


def register_all() -> None:
    _register_dataset_cross_product()
    _register_text_cross_product()
    _register_os_cases()
    _register_other_commands()


def main(argv: list[str] | None = None) -> int:
    global MOUNT_OK
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default=None, help="only cases whose name or group contains this")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    logging.getLogger("tokenloom").setLevel(logging.WARNING)
    build_valid()
    MOUNT_OK = _can_mount()
    register_all()
    signal.signal(signal.SIGALRM, _alarm)
    rows = []
    started = time.perf_counter()
    selected = [c for c in CASES if args.k is None or args.k in c.name or args.k in c.group]
    for number, item in enumerate(selected):
        tmp = BASE / f"case{number:04d}"
        tmp.mkdir()
        run: Run | None = None
        signal.alarm(TIMEOUT_S)
        try:
            run = item.setup(tmp)
            before = _digest(run.sources)
            outcome = execute(run)
            problem = judge(item, run, outcome)
            after = _digest(run.sources)
            if before != after:
                changed = sorted(set(before) ^ set(after) | {k for k in before if before.get(k) != after.get(k)})
                problem = f"SOURCE CHANGED {changed[:3]}" + (f"; {problem}" if problem else "")
            summary = _summary(outcome)
        except Timeout as exc:
            problem, summary = f"HANG: {exc}", "timeout"
        except Exception as exc:  # noqa: BLE001 - a setup that fails is a failed row, not a crash of the runner
            problem, summary = f"setup failed: {type(exc).__name__}: {exc}", "setup"
        finally:
            signal.alarm(0)
            if run is not None and run.cleanup is not None:
                run.cleanup()
        rows.append({"name": item.name, "group": item.group, "expect": item.expect, "outcome": summary,
                     "ok": problem is None, "problem": problem})  # fmt: skip
        mark = "ok  " if problem is None else "FAIL"
        print(f"{mark} {item.group:<20} {item.name:<62} {summary:<24} {problem or ''}", flush=True)
        subprocess.run(["chmod", "-R", "u+rwx", str(tmp)], capture_output=True)
    failed = [r for r in rows if not r["ok"]]
    groups: dict[str, list[int]] = {}
    for row in rows:
        groups.setdefault(row["group"], [0, 0])[0 if row["ok"] else 1] += 1
    print(f"\n{len(rows)} cases, {len(rows) - len(failed)} passed, {len(failed)} failed "
          f"({time.perf_counter() - started:.0f} s; OS failures {'on real mounts' if MOUNT_OK else 'simulated'})")  # fmt: skip
    for group, (good, bad_count) in groups.items():
        print(f"  {group:<22} {good + bad_count:>4} cases  {bad_count:>3} failed")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    shutil.rmtree(BASE, ignore_errors=True)
    return 1 if failed else 0


def _summary(outcome: Outcome) -> str:
    if outcome.exception is not None:
        return type(outcome.exception).__name__
    text = outcome.stdout + "\n" + outcome.stderr
    for line in text.splitlines():
        if (m := ERROR_LINE.match(line)) and m.group(1) in data_errors():
            return f"exit {outcome.exit_code} {m.group(1)}"
    return f"exit {outcome.exit_code}"


if __name__ == "__main__":
    sys.exit(main())
