"""Shared pieces of the bad-input catalogue (tools/fuzz/catalogue.py): rows, fixtures, helpers."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tokenloom.formats import DataError, open_writer, read_manifest
from tokenloom.formats.io import describe_files, write_manifest

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
TEXTS = [
    f"document {i}: " + " ".join(["alpha", "beta", "gamma", "delta"][: 1 + i % 4] * (1 + i % 7)) for i in range(40)
]


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
        with open_writer(target, format=fmt, dtype="uint16", vocab_size=256, eos_id=0, train_type="seq") as w:
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
        "name: x\ntokenized_info:\n  dtype: uint16\n  file_extension: bin\n"
        "  file_prefix: /else/tok\n  vocab_size: 256\n"
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


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


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


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tokenloom.formats", *args]


def _no_dac(command: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all", *command]
    return command


def _mount(point: Path, options: str) -> Callable[[], None]:
    point.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], check=True, capture_output=True)
    return lambda: subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=30) and None


def _can_mount() -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    point = Path(tempfile.mkdtemp(prefix="mnt-probe-", dir=BASE))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(point)], capture_output=True)
    if done.returncode == 0:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)
    return done.returncode == 0


MOUNT_OK: bool | None = None  # set by the runner (catalogue.main) before any case runs


def _rows(ds: Any) -> list[list[int]]:
    return [ds[i]["input_ids"].tolist() for i in range(len(ds))]


def _big_corpus(tmp: Path) -> Path:
    corpus = tmp / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text("".join(json.dumps({"text": t * 20}) + "\n" for t in TEXTS * 5))
    return corpus
