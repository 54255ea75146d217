"""Mutation fuzzing of every tokenloom reader (not a CI test: run it by hand, results in docs/fuzz.md).

    uv run python tools/fuzz/fuzz_readers.py --examples 300        # per reader; deterministic (derandomized)

For each reader a small valid dataset is written with tokenloom's own writers; hypothesis
then draws mutations of one of its files (truncation, byte flips, a splice of another
valid file's bytes, bytes appended, the file emptied) and the reader opens the result
(deep validation) and reads every entry. Allowed outcomes: a correct read or a
``DataError``. Anything else (another exception type, a hang beyond the timeout, a crash)
is a finding. A sample of the failing cases also goes through ``tokenloom inspect``,
which must exit 1 with a single line.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenloom.formats import DataError, open_dataset, open_writer
from tokenloom.formats.cli.commands import inspect

TIMEOUT_S = 10


class Hang(Exception):
    pass


def _alarm(_signum, _frame):
    raise Hang(f"no result within {TIMEOUT_S} s")


def _docs(rng: random.Random, n: int = 12) -> list[np.ndarray]:
    return [np.array([rng.randrange(1, 250) for _ in range(rng.randrange(1, 30))] + [0]) for _ in range(n)]


def _write(root: Path, fmt: str, **options) -> Path:
    rng = random.Random(fmt)
    target = root / fmt
    with open_writer(target, format=fmt.split("-legacy")[0], dtype="uint16", vocab_size=256, eos_id=0, **options) as w:
        for doc in _docs(rng):
            w.add(doc)
    return target


def _keyed(root: Path, fmt: str) -> Path:
    rng = random.Random(fmt)
    target = root / ("store.h5" if fmt == "h5" else "store-bin")
    with open_writer(target, format=fmt, dtype="uint16", vocab_size=256, eos_id=0, train_type="seq") as w:
        for doc in _docs(rng, 8):
            w.add_keyed({"sequence": doc})
    return target


def build_corpus(root: Path) -> dict[str, tuple[Path, Callable[[Path], object]]]:
    """reader name -> (valid dataset path, read function that touches every entry)."""

    def read_all(path: Path, **kw) -> int:
        ds = open_dataset(path, validate="deep", **kw)
        return sum(int(ds[i].sum()) for i in range(len(ds)))

    corpus: dict[str, tuple[Path, Callable[[Path], object]]] = {}
    corpus["native"] = (_write(root, "native", shard_size_tokens=60), read_all)
    corpus["flat-npy"] = (_write(root, "flat", shard_size_tokens=60), read_all)
    flat_bin = root / "flat-bin"
    with open_writer(flat_bin, format="flat", dtype="uint16", vocab_size=256, eos_id=0, file_format="bin") as w:
        for doc in _docs(random.Random("flat-bin")):
            w.add(doc)
    corpus["flat-bin"] = (flat_bin, read_all)
    mega = root / "mega" / "data"
    with open_writer(mega, format="megatron", dtype="uint16", vocab_size=256, eos_id=0) as w:
        for doc in _docs(random.Random("megatron")):
            w.add(doc)
    corpus["megatron"] = (mega.parent, lambda p: read_all(p, vocab_size=256, eos_id=0))
    packed = root / "data.pbin"
    with open_writer(packed, format="packed", dtype="uint16", vocab_size=256, eos_id=0) as w:
        for doc in _docs(random.Random("packed")):
            w.add(doc)
    corpus["packed"] = (packed, read_all)
    legacy = root / "legacy.pbin"
    with open_writer(legacy, format="packed", dtype="uint32", vocab_size=256, eos_id=0, legacy=True) as w:
        for doc in _docs(random.Random("legacy")):
            w.add(doc)
    corpus["packed-legacy"] = (legacy, read_all)
    corpus["h5"] = (_keyed(root, "h5"), read_all)
    corpus["bin-meta"] = (_keyed(root, "bin-meta"), lambda p: read_all(p))

    from tokenloom.tokenize.jsonl_index import JsonlIndex

    jsonl = root / "lines.jsonl"
    jsonl.write_bytes(b"".join(json.dumps({"text": "x" * i}).encode() + b"\n" for i in range(40)))
    JsonlIndex(jsonl)

    def read_jsonl(path: Path) -> int:
        index = JsonlIndex(path / "lines.jsonl")
        return sum(len(index.raw(i)) for i in range(len(index)))

    jdir = root / "jsonl"
    jdir.mkdir()
    for name in ("lines.jsonl", "lines.jsonl.idx.npy", "lines.jsonl.idx.json"):
        shutil.move(root / name, jdir / name)
    corpus["jsonl-index"] = (jdir, read_jsonl)
    corpus.update(_more_readers(root, read_all))
    return corpus


TATM_YAML = """\
name: fuzz
description: a tatm metadata file as yaml.dump writes it, long enough to wrap over more than one
  line of block-style YAML
tokenized_info:
  dtype: uint16
  file_extension: bin
  file_prefix: /elsewhere/tokenized
  tokenizer: bpe
  vocab_size: 256
"""


def _gpt_simple_shard(directory: Path, stem: str, docs: list[np.ndarray], code: int, dtype: str) -> None:
    """A shard exactly as GPT-Simple's pretokenize writes it (``<4sIII`` header, no manifest)."""
    directory.mkdir(parents=True, exist_ok=True)
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype("<i8")
    overlaps = np.array([min(2, len(d)) if i % 3 == 1 else 0 for i, d in enumerate(docs)], "<u2")
    (directory / f"{stem}.bin").write_bytes(np.concatenate(docs).astype(dtype).tobytes())
    header = b"GPTS" + np.array([1, code, len(docs)], "<u4").tobytes()
    (directory / f"{stem}.idx").write_bytes(header + offsets.tobytes() + overlaps.tobytes())


def _record_store(root: Path, groups: dict[str, tuple[list[list], str]]) -> Path:
    """AstrAI's ``save_bin`` with every key a record key: concatenated records + cumulative offsets."""
    root.mkdir(parents=True)
    meta = {}
    for key, (records, dtype) in groups.items():
        flat = np.asarray([v for record in records for v in record], dtype=dtype)
        flat.tofile(root / f"{key}.bin")
        offsets = np.concatenate([[0], np.cumsum([len(r) for r in records])]).astype(int).tolist()
        meta[key] = {"shape": [len(flat)], "dtype": dtype, "offsets": offsets}
    (root / "meta.json").write_text(json.dumps(meta))
    return root


def _more_readers(root: Path, read_all: Callable[..., int]) -> dict[str, tuple[Path, Callable[[Path], object]]]:
    """Record stores, keyed stores by key, native-v0, manifest-less GPT-Simple and tatm directories."""
    import dataclasses
    import struct

    from tokenloom.datasets import DatasetFactory
    from tokenloom.formats import open_records, open_store, read_manifest
    from tokenloom.formats.io import describe_files, write_manifest

    corpus: dict[str, tuple[Path, Callable[[Path], object]]] = {}
    rng = random.Random("records")

    def side(n: int, lo: int = 1) -> list[list[int]]:
        return [[rng.randrange(1, 250) for _ in range(rng.randrange(lo, 12))] for _ in range(n)]

    chosen, rejected = side(6), side(6)
    dpo = _record_store(
        root / "records-dpo",
        {
            "chosen": (chosen, "int32"),
            "rejected": (rejected, "int32"),
            "chosen_mask": ([[int(j > 1) for j in range(len(r))] for r in chosen], "bool"),
            "rejected_mask": ([[int(j > 1) for j in range(len(r))] for r in rejected], "bool"),
        },
    )

    def read_records(path: Path, train_type: str) -> int:
        store = open_records(path, validate="deep")
        total = 0
        for i in range(len(store)):
            for value in store.record(i).values():
                parts = value if isinstance(value, list) else [value]
                total += sum(int(np.asarray(v, dtype=np.float64).sum()) for v in parts)
        dataset = DatasetFactory.load(train_type, path)  # AstrAI's record mode: RecordDataset
        for i in range(len(dataset)):
            dataset[i]
        return total

    corpus["records-dpo"] = (dpo, lambda p: read_records(p, "dpo"))
    sizes = [rng.randrange(1, 4) for _ in range(4)]
    responses = side(sum(sizes))
    grpo = _record_store(
        root / "records-grpo",
        {
            "prompts": (side(4), "int32"),
            "responses": (responses, "int32"),
            "masks": ([[1] * len(r) for r in responses], "bool"),
            "rewards": ([[rng.random() for _ in range(g)] for g in sizes], "float32"),
        },
    )
    corpus["records-grpo"] = (grpo, lambda p: read_records(p, "grpo"))

    def read_store(path: Path) -> int:
        store = open_store(path, train_type="sft", validate="deep")
        fetched = store.fetch(0, len(store), list(store.keys))
        return sum(int(np.asarray(v).sum()) for v in fetched.values())

    for fmt, name in (("h5", "store-sft.h5"), ("bin-meta", "store-sft")):
        target = root / name
        with open_writer(target, format=fmt, dtype="uint16", vocab_size=256, eos_id=0, train_type="sft") as w:
            for doc in _docs(random.Random(name), 8):
                w.add_keyed(
                    {
                        "sequence": doc,
                        "loss_mask": (np.arange(len(doc)) > 1).astype(np.uint8),
                        "position_ids": np.arange(len(doc)),
                    }
                )
        corpus[f"store-{fmt}"] = (target, read_store)

    v0 = root / "native-v0"
    with open_writer(v0, format="native", dtype="uint16", vocab_size=256, eos_id=0, shard_size_tokens=60) as w:
        for doc in _docs(random.Random("native-v0")):
            w.add(doc)
    manifest = read_manifest(v0)
    for f in manifest.files:
        if f.name.endswith(".idx"):
            idx = v0 / f.name
            count = struct.unpack_from("<I", idx.read_bytes(), 12)[0]
            idx.write_bytes(struct.pack("<4sHHQ", b"GPTS", 1, 2, count) + idx.read_bytes()[16:])
    files = describe_files(v0, [(f.name, f.role) for f in manifest.files])
    write_manifest(v0, dataclasses.replace(manifest, version=1, files=files, checksum=""))
    corpus["native-v0"] = (v0, lambda p: read_all(p, format="native-v0"))

    gpts = root / "gpt-simple"
    docs = _docs(random.Random("gpt-simple"), 16)
    _gpt_simple_shard(gpts, "shard_00000", docs[:8], 2, "<u2")
    _gpt_simple_shard(gpts, "shard_00001", docs[8:], 2, "<u2")

    def read_fast(path: Path, **kw) -> int:
        ds = open_dataset(path, **kw)  # the default validation
        return sum(int(ds[i].sum()) for i in range(len(ds))) + int(ds.overlap_prefix.sum())

    corpus["gpt-simple-fast"] = (gpts, read_fast)
    gpts32 = root / "gpt-simple-u32"
    _gpt_simple_shard(gpts32, "shard_00000", docs[:8], 4, "<u4")
    _gpt_simple_shard(gpts32, "shard_00001", docs[8:], 4, "<u4")
    corpus["gpt-simple-deep"] = (gpts32, read_all)

    tatm = root / "tatm"
    tatm.mkdir()
    (tatm / "metadata.yaml").write_text(TATM_YAML)
    tdocs = _docs(random.Random("tatm"), 16)
    np.concatenate(tdocs[:8]).astype("<u2").tofile(tatm / "tokenized_0.bin")
    np.concatenate(tdocs[8:]).astype("<u2").tofile(tatm / "tokenized_1.bin")
    corpus["tatm-fast"] = (tatm, read_fast)
    corpus["tatm-deep"] = (tatm, read_all)
    return corpus


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file())


def mutate(data: st.DataObject, files: list[Path], donors: list[Path]) -> str:
    target = data.draw(st.sampled_from(files), label="file")
    raw = bytearray(target.read_bytes())
    kind = data.draw(st.sampled_from(["truncate", "flip", "splice", "append", "empty", "zero-run"]), label="kind")
    if kind == "truncate" and raw:
        raw = raw[: data.draw(st.integers(0, len(raw) - 1), label="at")]
    elif kind == "flip" and raw:
        for _ in range(data.draw(st.integers(1, 8), label="flips")):
            i = data.draw(st.integers(0, len(raw) - 1), label="byte")
            raw[i] ^= data.draw(st.integers(1, 255), label="mask")
    elif kind == "splice":
        donor = data.draw(st.sampled_from(donors), label="donor").read_bytes()
        if donor and raw:
            a = data.draw(st.integers(0, len(raw)), label="a")
            b = data.draw(st.integers(0, len(donor) - 1), label="b")
            raw[a:] = donor[b : b + data.draw(st.integers(1, 4096), label="n")]
    elif kind == "append":
        raw += data.draw(st.binary(min_size=1, max_size=64), label="tail")
    elif kind == "empty":
        raw = bytearray()
    elif kind == "zero-run" and raw:
        a = data.draw(st.integers(0, len(raw) - 1), label="a")
        raw[a : a + data.draw(st.integers(1, 64), label="n")] = bytes(min(len(raw) - a, 64))
    target.write_bytes(bytes(raw))
    return f"{kind} {target.name}"


def _fast_open_fails(path: Path) -> bool:
    """Whether the fast open (what ``inspect`` does) fails too: only then must ``inspect`` exit 1."""
    try:
        open_dataset(path, validate="fast")
    except DataError:
        return True
    return False


def make_case(
    examples: int,
    base: Path,
    donors: list[Path],
    name: str,
    valid: Path,
    read: Callable[[Path], object],
    outcomes: collections.Counter[str],
    findings: list[str],
) -> Callable[[], None]:
    """One hypothesis test: mutate a copy of ``valid`` and read it; outcomes and findings are counted."""
    cli_checked = [0]

    @settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def case(data: st.DataObject) -> None:
        work = base / "case"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        copy = work / valid.name
        (shutil.copytree if valid.is_dir() else shutil.copy)(valid, copy)
        what = mutate(data, _files(copy), donors)
        signal.alarm(TIMEOUT_S)
        try:
            read(copy)
            outcomes["read"] += 1
        except DataError as exc:
            outcomes[type(exc).__name__] += 1
            if name != "jsonl-index" and cli_checked[0] < 20 and _fast_open_fails(copy):
                cli_checked[0] += 1
                result = CliRunner().invoke(inspect, [str(copy)])
                lines = result.output.strip().splitlines()
                if result.exit_code != 1 or len(lines) != 1:
                    findings.append(f"{what}: inspect exit {result.exit_code}, {len(lines)} lines")
        except Hang as exc:
            findings.append(f"{what}: HANG {exc}")
        except Exception as exc:
            outcomes["ESCAPE " + type(exc).__name__] += 1
            findings.append(f"{what}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}")
        finally:
            signal.alarm(0)

    return case


def run(examples: int, only: list[str] | None) -> dict[str, dict[str, object]]:
    base = Path(tempfile.mkdtemp(prefix="tokenloom-fuzz-"))
    corpus = build_corpus(base / "valid")
    donors = [f for path, _ in corpus.values() for f in _files(path)]
    report: dict[str, dict[str, object]] = {}
    signal.signal(signal.SIGALRM, _alarm)
    for name, (valid, read) in corpus.items():
        if only and name not in only:
            continue
        outcomes: collections.Counter[str] = collections.Counter()
        findings: list[str] = []
        started = time.perf_counter()

        case = make_case(examples, base, donors, name, valid, read, outcomes, findings)
        case()
        report[name] = {
            "executions": sum(outcomes.values()),
            "outcomes": dict(outcomes.most_common()),
            "findings": findings[:10],
            "finding_count": len(findings),
            "seconds": round(time.perf_counter() - started, 1),
        }
        print(json.dumps({name: report[name]}, indent=1), flush=True)
    shutil.rmtree(base, ignore_errors=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=300, help="mutations per reader")
    parser.add_argument("--only", nargs="*", default=None, help="reader names")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.getLogger("tokenloom").setLevel(logging.ERROR)  # rebuilt indexes and healed caches are expected
    report = run(args.examples, args.only)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 1 if any(r["finding_count"] for r in report.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
