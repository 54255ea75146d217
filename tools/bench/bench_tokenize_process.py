"""``tokenloom tokenize`` against the plain pipeline, both as whole processes (issue 38 item 2).

The same jsonl input (text of this environment's site-packages ``.py``/``.txt`` files, sorted by path, cut into
documents of at most 64 KiB: deterministic for one environment), the same tokenizer (the shipped 16k byte-level BPE):

- plain: one process that reads each jsonl file, orjson-parses its lines, encodes the file's texts with one fastokens
  ``encode_batch_flat`` call, appends EOS after every document, and writes the uint32 ids and the uint64 offsets
  (what a user writes by hand; no crash safety, no checks).
- tokenloom: ``python -m tokenloom.formats tokenize --num-workers 2 --no-progress`` (engine auto: fast; crash-safe
  writes, checksums and block hashes, the run-time engine check).

Each run is a fresh subprocess; *wall* is its whole life (interpreter start and imports included), *CPU* the
user+sys seconds of it and every descendant (``getrusage(RUSAGE_CHILDREN)`` deltas, with this process the child
subreaper so that forkserver workers would count: ``_tree_time.py``; with the shipped tokenizer ``--num-workers 2``
encodes on two threads of the one process and starts no worker process, checked with strace), beside tokenloom's own
clock (the time the command prints). Both run twice a round: with bytecode cached (.pyc files present, as in any
installed environment) and without (``PYTHONDONTWRITEBYTECODE=1`` and no .pyc: the shells of the machine where the
issue measured 0.68x have it, and ``uv sync`` compiles nothing by default; each run then compiles every module it
imports, and tokenloom imports about 3.4 MB of source to plain's 2 MB). Rows interleave, median of 3. Tokens count
document tokens (EOD excluded). The load average is read before and after.

    uv run python tools/bench/bench_tokenize_process.py [--quick] [--full] [--mb N]

Default and ``--full``: 115 MB, the issue's size (about 35 s at load 2; at 60 MB the fixed cost of interpreter start,
imports and the engine check, about 0.3 CPU-s, weighed twice as much against a 0.8 CPU-s job); ``--quick``: 8 MB,
one round.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import sysconfig
import tempfile
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tree_time import timed_tree

REPO = Path(__file__).resolve().parents[2]
OUTPUT = REPO / "docs" / "benchmarks" / "tokenize-process.md"
RUNS = 3
DOC_CHARS = 64 << 10
FILE_BYTES = 8 << 20

PLAIN = r"""
import sys, time
start = time.perf_counter()
from pathlib import Path
import numpy as np, orjson, fastokens
files, tokenizer, out = sys.argv[1].split(","), sys.argv[2], Path(sys.argv[3])
out.mkdir(parents=True, exist_ok=True)
tok = fastokens.Tokenizer.from_file(tokenizer + "/tokenizer.json")
eos = int(sys.argv[4])
tokens = 0
encode_cpu = 0.0
for n, name in enumerate(files):
    with open(name, "rb") as f:
        texts = [orjson.loads(line)["text"] for line in f]
    cpu = time.process_time()
    ids, offsets = tok.encode_batch_flat(texts)
    encode_cpu += time.process_time() - cpu
    ids = np.frombuffer(ids, np.uint32)
    offsets = np.frombuffer(offsets, np.uint64).astype(np.int64)
    tokens += len(ids)
    with_eos = np.insert(ids, offsets[1:], eos).astype(np.uint32)
    with open(out / f"{n:05d}.bin", "wb") as f:
        f.write(with_eos.tobytes())
    with open(out / f"{n:05d}.idx", "wb") as f:
        f.write((offsets + np.arange(len(offsets))).astype(np.uint64).tobytes())
seconds = time.perf_counter() - start
print(orjson.dumps({"seconds": seconds, "tokens": tokens, "encode_cpu": encode_cpu}).decode())
"""


def make_input(root: Path, megabytes: float) -> list[Path]:
    """jsonl files of about ``megabytes`` MB in total from site-packages text, deterministically."""
    root.mkdir(parents=True, exist_ok=True)
    site = Path(sysconfig.get_paths()["purelib"])
    budget = int(megabytes * 1e6)
    files: list[Path] = []
    current: list[bytes] = []
    size = written = 0

    def flush() -> None:
        nonlocal size
        if current:
            files.append(root / f"part-{len(files):04d}.jsonl")
            files[-1].write_bytes(b"".join(current))
            current.clear()
            size = 0

    for path in sorted(site.rglob("*")):
        if written >= budget:
            break
        if path.suffix not in (".py", ".txt") or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for start in range(0, len(text), DOC_CHARS):
            line = orjson.dumps({"text": text[start : start + DOC_CHARS]}) + b"\n"
            current.append(line)
            size += len(line)
            written += len(line)
        if size >= FILE_BYTES:
            flush()
    flush()
    return files


def timed_process(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall s, CPU s of the process and every descendant, forkserver workers included, stdout) of one subprocess."""
    wall, cpu, done = timed_tree(cmd, env, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed ({done.returncode}): {done.stderr[-3000:]}")
    return wall, cpu, done.stdout + done.stderr


def _env(pycache: Path | None) -> dict[str, str]:
    """The children's environment: offline; with ``pycache``, bytecode cached there (as in any installed
    environment: pip compiles at install, Python caches on first import), else compiled on every import (what
    ``PYTHONDONTWRITEBYTECODE=1`` without .pyc files does: tokenloom has more source to compile than plain)."""
    drop = ("RAYON_NUM_THREADS", "FASTOKENS_BPE_THREADS", "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if pycache is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


Row = tuple[float, float, float, int]  # own clock s, wall s, CPU s, document tokens


def run(quick: bool, megabytes: float | None = None, full: bool = False) -> str:
    from tokenloom.tokenize import default_tokenizer_path

    size = megabytes or (8 if quick and not full else 115)
    runs = 1 if quick else RUNS
    tokenizer = str(default_tokenizer_path())
    eos = json.loads(Path(tokenizer, "tokenizer.json").read_text())["added_tokens"][0]["id"]
    load_before = _load()
    modes = {"bytecode cached": True, "no bytecode cache": False}
    rows: dict[tuple[str, str], list[Row]] = {(m, w): [] for m in modes for w in ("plain", "tokenloom")}
    with tempfile.TemporaryDirectory(prefix="bench-tokenize-process-") as tmp_name:
        tmp = Path(tmp_name)
        envs = {mode: _env(tmp / "pycache" if cached else None) for mode, cached in modes.items()}
        files = make_input(tmp / "in", size)
        input_mb = sum(f.stat().st_size for f in files) / 1e6
        encode_cpu: list[float] = []  # CPU-s of plain's encode_batch_flat calls alone: the physical limit

        def plain(out_dir: Path, env: dict[str, str]) -> Row:
            cmd = [sys.executable, "-c", PLAIN, ",".join(map(str, files)), tokenizer, str(out_dir), str(eos)]
            wall, cpu, out = timed_process(cmd, env)
            data = json.loads(out.strip().splitlines()[-1])
            encode_cpu.append(float(data["encode_cpu"]))
            return data["seconds"], wall, cpu, int(data["tokens"])

        def tokenloom(out_dir: Path, env: dict[str, str]) -> Row:
            cmd = [sys.executable, "-m", "tokenloom.formats", "tokenize", "--input-dir", str(tmp / "in")]
            cmd += ["--output-dir", str(out_dir), "--num-workers", "2", "--no-progress", "--overwrite"]
            wall, cpu, out = timed_process(cmd, env)
            timed = float(re.search(r"([0-9.]+) s(?:,| =) [0-9,]+ tokens/s", out)[1])  # type: ignore[index]
            manifest = json.loads((out_dir / "manifest.json").read_text())
            return timed, wall, cpu, manifest["num_tokens"] - manifest["num_documents"]

        contenders = {"plain": plain, "tokenloom": tokenloom}
        for name, measure in contenders.items():  # one untimed run each fills the bytecode cache
            measure(tmp / f"out-{name}", envs["bytecode cached"])
        for _ in range(runs):  # interleaved, so that load from other processes drifts over every row alike
            for mode in modes:
                for name, measure in contenders.items():
                    rows[mode, name].append(measure(tmp / f"out-{name}", envs[mode]))
    load_after = _load()
    med = {key: tuple(statistics.median(r[i] for r in runs_) for i in range(4)) for key, runs_ in rows.items()}
    lines = [
        "## tokenize: whole process against the plain pipeline",
        "",
        f"Command: `uv run python tools/bench/bench_tokenize_process.py{' --quick' if quick else ''}"
        f"`. Input: {input_mb:.0f} MB of jsonl ({len(files)} files) of site-packages "
        f"text, {med['bytecode cached', 'plain'][3] / 1e6:.1f} M document tokens; tokenizer: the shipped 16k BPE. "
        "plain: one process that reads each file, orjson-parses it, encodes it with one fastokens "
        "`encode_batch_flat` call, appends EOS and writes uint32 ids and uint64 offsets; tokenloom: "
        "`tokenloom tokenize --num-workers 2 --no-progress` (engine auto: fast; crash-safe writes, checksums, "
        "the run-time engine check). A fresh process per run, interleaved, median of "
        f"{runs}. *Own clock*: the time each prints (plain: from its first line, imports included; tokenloom: its "
        "summary's, after its imports). *Wall*/*CPU*: the whole process and its children (CPU = user + sys, "
        "`getrusage(RUSAGE_CHILDREN)`). *Bytecode cached*: the .pyc files exist (any installed environment, "
        "filled here by one untimed run each); *no bytecode cache*: every run compiles every module it imports "
        "(`PYTHONDONTWRITEBYTECODE=1` and no .pyc, as where the issue measured 0.68x): tokenloom imports more "
        f"source than plain. Load average before {load_before}, after {load_after} (2 cores).",
        "",
        "| what | own clock s | wall s | CPU s | M tokens/s wall | M tokens/CPU-s | vs plain wall | vs plain CPU |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    notes = []
    for (mode, name), (timed, wall, cpu, tokens) in med.items():
        plain_row = med[mode, "plain"]
        if tokens != plain_row[3]:
            notes.append(f"{name} ({mode}): {tokens:,.0f} tokens, plain {plain_row[3]:,.0f}")
        lines.append(
            f"| {name} ({mode}) | {timed:.2f} | {wall:.2f} | {cpu:.2f} | {tokens / wall / 1e6:.2f} "
            f"| {tokens / cpu / 1e6:.2f} | {plain_row[1] / wall:.2f}x | {plain_row[2] / cpu:.2f}x |"
        )
    tokens = med["bytecode cached", "plain"][3]
    limit = statistics.median(encode_cpu)
    lines.append(
        f"| limit: fastokens `encode_batch_flat` alone (its calls in plain, CPU of the process) | - | - | {limit:.2f} "
        f"| - | {tokens / limit / 1e6:.2f} | - | - |"
    )
    lines += [f"- token counts differ: {n}" for n in notes]
    text = "\n".join(lines) + "\n"
    if not quick and megabytes is None:
        OUTPUT.parent.mkdir(parents=True, exist_ok=True)
        OUTPUT.write_text(text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="8 MB, one run")
    parser.add_argument("--full", action="store_true", help="115 MB, the issue's size")
    parser.add_argument("--mb", type=float, help="input size in MB (the report is then not written)")
    args = parser.parse_args()
    print(run(args.quick, args.mb, args.full))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
