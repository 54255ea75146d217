"""Catalogue rows: bad token datasets x the commands that read them, bad text x the commands that tokenize."""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _catalogue_base import (
    CASES,
    TEXTS,
    Case,
    Run,
    _tokenizer,
    copy,
    first,
    flip,
    truncate,
)

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
            Run(
                argv=["convert", str(path), str(tmp / "out" / "data"), "--to", "megatron", "--no-progress"], sources=src
            ),
            "convert",
        ),
        "open_dataset": (Run(call=read_all("fast"), sources=src), "fast"),
        "open_dataset-deep": (Run(call=read_all("deep"), sources=src), "deep"),
    }


def register_dataset_cross_product() -> None:
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
            argv=[
                "tokenize",
                "--input-dir",
                str(directory),
                "--output-dir",
                str(tmp / "out"),
                "--num-workers",
                "0",
                "--no-progress",
                *common,
            ],
            sources=src,
        ),
        "tokenize-megatron": Run(
            argv=[
                "tokenize",
                "--input-dir",
                str(directory),
                "--output-dir",
                str(tmp / "out"),
                "--num-workers",
                "0",
                "--no-progress",
                "--format",
                "megatron",
                *common,
            ],
            sources=src,
        ),
        "pack": Run(
            argv=[
                "pack",
                str(files[-1]),
                "--output",
                str(tmp / "out.pbin"),
                "--num-workers",
                "0",
                "--no-progress",
                *pack_extra,
            ],
            sources=src,
        ),
        "eval-cache": Run(
            argv=[
                "eval-cache",
                *eval_files,
                "--seq-len",
                "8",
                "--cache-dir",
                str(tmp / "cache"),
                "--no-progress",
                *[a for a in common if a != "--eos-id" and not a.isdigit()],
            ],
            sources=src,
        ),
    }


def register_text_cross_product() -> None:
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
