"""Catalogue rows for wave 3's correctness issue (#21): the formats items that are an input or a fault."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

from _catalogue_base import Outcome, Run, _cli, case, copy

from tokenloom.formats import read_manifest
from tokenloom.formats.io import lock_path, write_manifest

# -- item 3: the writer lock never blocks nor reads without bound ---------------------------------------


@case("convert: a FIFO where the output lock is expected", "hang", "error", "UnsafePathError")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    out = tmp / "out"
    os.mkfifo(lock_path(out))
    return Run(process=_cli("convert", str(src), str(out), "--to", "native", "--no-progress"), sources=[src])


@case("convert: the output lock is a symlink to /dev/zero", "memory", "error", "UnsafePathError")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    out = tmp / "out"
    lock_path(out).symlink_to("/dev/zero")
    return Run(process=_cli("convert", str(src), str(out), "--to", "native", "--no-progress"), sources=[src])


# -- item 4: a NUL byte in a manifest's file name -------------------------------------------------------


def _nul_manifest(tmp: Path) -> Path:
    src = copy("native", tmp)
    manifest = read_manifest(src)
    files = [dataclasses.replace(f, name=f.name.replace(".bin", "\0.bin")) for f in manifest.files]
    write_manifest(src, dataclasses.replace(manifest, files=tuple(files)))
    return src


@case("validate: a NUL byte in a manifest's shard name", "bare traceback", "error", "FormatError")
def _(tmp: Path) -> Run:
    return Run(argv=["validate", str(_nul_manifest(tmp))])


@case("open_dataset: a NUL byte in a manifest's shard name", "bare traceback", "error", "FormatError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    src = _nul_manifest(tmp)
    return Run(call=lambda: open_dataset(src))


# -- items 5 and 6: tokenloom index ---------------------------------------------------------------------


@case("index: a binary file named .jsonl (NUL bytes)", "input", "error", "FormatError")
def _(tmp: Path) -> Run:
    path = tmp / "blob.jsonl"
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 64)
    return Run(argv=["index", str(path)], sources=[path])


@case("index: a .jsonl file that is not UTF-8", "input", "error", "FormatError")
def _(tmp: Path) -> Run:
    path = tmp / "latin1.jsonl"
    path.write_bytes('{"text": "caf\u00e9"}\n'.encode("latin-1"))
    return Run(argv=["index", str(path)], sources=[path])


@case("index: 8 concurrent runs on one file all succeed (unique temp names)", "race", "ok")
def _(tmp: Path) -> Run:
    path = tmp / "a.jsonl"
    path.write_bytes(b"".join(b'{"text": "%d"}\n' % i for i in range(50_000)))
    code = "from tokenloom.formats.cli import main; main()"

    def call() -> list[int]:
        runs = [
            subprocess.Popen(
                [sys.executable, "-c", code, "index", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            for _ in range(8)
        ]
        return [run.wait(timeout=120) for run in runs]

    def check(outcome: Outcome) -> str | None:
        if outcome.value != [0] * 8:
            return f"exit codes {outcome.value}"
        left = sorted(p.name for p in tmp.iterdir() if p.name.endswith(".tmp"))
        return f"temp files left: {left}" if left else None

    return Run(call=call, sources=[path], check=check)


# -- item 2: the sidecar that keeps EOS id, vocab size and tokenizer for megatron and packed ---------------


@case("open a .pbin whose sidecar describes other data", "input", "error", "FormatError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset, open_writer

    src = copy("data.pbin", tmp)
    with open_writer(tmp / "other.pbin", format="packed", dtype="uint16", eos_id=0) as writer:
        writer.add([1, 2, 0])
    (tmp / "data.pbin.tokenloom.json").write_bytes((tmp / "other.pbin.tokenloom.json").read_bytes())
    return Run(call=lambda: open_dataset(src))


@case("megatron: a FIFO where the sidecar is expected", "hang", "error", "UnsafePathError")
def _(tmp: Path) -> Run:
    src = copy("megatron", tmp)
    (src / "data.tokenloom.json").unlink(missing_ok=True)
    os.mkfifo(src / "data.tokenloom.json")
    return Run(argv=["validate", str(src / "data")])


@case("convert --eos-id contradicting the source's recorded EOS id", "input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    return Run(argv=["convert", str(src), str(tmp / "out"), "--to", "megatron", "--eos-id", "7", "--no-progress"])
