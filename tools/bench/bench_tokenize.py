"""Benchmark ``tokenloom tokenize`` against the tokenizer's raw speed and two peers.

On the same jsonl files (copies of the stdlib docstring corpus) and the same
tokenizer (the shipped 16k byte-level BPE), each measurement in a fresh process:

- raw: ``Tokenizer.encode_batch`` over every text, already in memory, one call,
  both cores (rayon). Only the call is timed. (``encode_batch_fast`` measured
  0.59x ``encode_batch`` here, so the faster of the two is the baseline.)
- raw fastokens: ``fastokens.Tokenizer.encode_batch_flat`` over the same texts,
  one call (the fast engine's bulk API: the new limit for tokenize).
- tokenloom: the ``tokenloom tokenize`` command end to end (interpreter start,
  worker start, reading, JSON parsing, encoding, windowing, writing, fsync,
  manifest), wall clock, with 2 workers (engine auto, which picks the
  fast engine for this tokenizer), and (with ``--hf-engine``) on ``--engine hf``.
- Hugging Face ``datasets``: ``load_dataset("json")`` + ``.map(batched=True,
  num_proc=2)`` with the same tokenizer (fast), load and map timed.
- litdata ``optimize`` (litgpt's recipe: one tokenizer.encode per document,
  TokensLoader chunks), 2 workers, timed end to end in its process.

The two peers read a quarter of the files (8 of the 32 copies; at about 0.4 M tokens/s all 32
took 50 s a round): every file is the same corpus, so their token count is exactly a quarter
of the others' and their tokens/s compares as is.

Throughput counts document tokens (EOD tokens excluded, so every row counts the
same tokens). Peak RSS is the sum over the measured process and its children,
sampled every 50 ms. Each figure is the median of 3 runs. ``--full`` (run.py --full) adds the rows
no issue target needs: raw ``encode_batch``, the two peers and peak RSS of tokenloom as the input grows 4x
(about two minutes of a run here); by default the section is tokenloom beside the fast engine's limit.

    uv run --group bench python tools/bench/bench_tokenize.py [--quick] [--full] [--hf-engine]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _forkserver import ForkServers

REPO = Path(__file__).resolve().parents[2]
OUTPUT = REPO / "docs" / "benchmarks" / "tokenize.md"
RUNS = 3

_RAW = r"""
import json, sys, time, orjson
from tokenizers import Tokenizer
files, tokenizer, method = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
texts = [orjson.loads(line)["text"] for f in files for line in open(f, "rb")]
tok = Tokenizer.from_file(tokenizer + "/tokenizer.json")
encode = getattr(tok, method)
start = time.perf_counter()
encodings = encode(texts, add_special_tokens=False)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "tokens": sum(len(e.ids) for e in encodings)}))
"""

_RAW_FASTOKENS = r"""
import json, sys, time, orjson
import fastokens
files, tokenizer = sys.argv[1].split(","), sys.argv[2]
texts = [orjson.loads(line)["text"] for f in files for line in open(f, "rb")]
tok = fastokens.Tokenizer.from_file(tokenizer + "/tokenizer.json")
start = time.perf_counter()
ids, offsets = tok.encode_batch_flat(texts)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "tokens": len(ids) // 4}))
"""

_DATASETS = r"""
import json, sys, time
files, tokenizer, cache = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
from datasets import load_dataset, disable_progress_bars
from transformers import AutoTokenizer
disable_progress_bars()
tok = AutoTokenizer.from_pretrained(tokenizer)
start = time.perf_counter()
ds = load_dataset("json", data_files=files, split="train", cache_dir=cache)
def encode(batch):
    return {"input_ids": tok(batch["text"], add_special_tokens=False)["input_ids"]}
out = ds.map(encode, batched=True, num_proc=2, remove_columns=ds.column_names)
seconds = time.perf_counter() - start
tokens = sum(len(x) for x in out["input_ids"])
print(json.dumps({"seconds": seconds, "tokens": tokens}))
"""

_LITDATA = r"""
import json, sys, time
from functools import partial
import orjson
files, tokenizer, out = sys.argv[1].split(","), sys.argv[2], sys.argv[3]

def encode(path, tokenizer_dir=None):
    import torch
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer_dir + "/tokenizer.json")
    for line in open(path, "rb"):
        yield torch.tensor(tok.encode(orjson.loads(line)["text"], add_special_tokens=False).ids, dtype=torch.int)

if __name__ == "__main__":
    from litdata import optimize
    from litdata.streaming.item_loader import TokensLoader
    start = time.perf_counter()
    optimize(fn=partial(encode, tokenizer_dir=tokenizer), inputs=files, output_dir=out, num_workers=2,
             chunk_size=2049 * 1024, item_loader=TokensLoader())
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds}))
"""


def _tree_rss_mb(root: int) -> float:
    """Resident memory of ``root`` and all its descendants, in MiB."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def _measure(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """(wall seconds, peak tree RSS MiB, stdout) of one subprocess."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    peak = 0.0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_rss_mb(proc.pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed ({proc.returncode}): {err.decode()[-3000:]}")
    return wall, peak, out.decode()


def _measure_forked(servers: ForkServers, argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    """(peak tree RSS MiB, stdout) of one run of ``argv`` (script or ``-c`` code, and args) in a fork of a server
    that did the script's imports (_forkserver.py): the peers' 4-8 s of imports a run are outside their clocks,
    and a fork does not pay them again. Their wall time is not a whole-process time then, so it is not reported;
    their peak RSS leaves out the library pages the imports touched and the run does not."""
    peak = 0.0
    done = threading.Event()
    samplers: list[threading.Thread] = []

    def sample(pid: int) -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_rss_mb(pid))
            time.sleep(0.05)

    def start(pid: int) -> None:
        samplers.append(threading.Thread(target=sample, args=(pid,), daemon=True))
        samplers[-1].start()

    try:
        finished = servers.run(argv, timeout=1800, env=env, on_start=start)
    finally:
        done.set()
        for thread in samplers:
            thread.join()
    if finished.returncode != 0:
        raise RuntimeError(f"{argv[:2]} failed ({finished.returncode}): {finished.stderr[-3000:]}")
    return peak, finished.stdout


def _env(parallel: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAYON_NUM_THREADS",)}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env["TOKENIZERS_PARALLELISM"] = "true" if parallel else "false"
    return env


def _make_inputs(root: Path, corpus: Path, copies: int) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(copies):
        target = root / f"part-{i:04d}.jsonl"
        shutil.copyfile(corpus, target)
        files.append(target)
    return files


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _tokenloom(input_dir: Path, out: Path, workers: int, engine: str = "auto") -> tuple[float, float, float, int]:
    """(timed s: the run as the command reports it, wall s incl. interpreter start, peak MiB, tokens)."""
    cmd = [sys.executable, "-m", "tokenloom.formats", "tokenize", "--input-dir", str(input_dir)]
    cmd += ["--output-dir", str(out), "--num-workers", str(workers), "--no-progress", "--overwrite"]
    cmd += ["--engine", engine]
    wall, peak, out_text = _measure(cmd, _env(parallel=True))
    timed = float(re.search(r"([0-9.]+) s(?:,| =) [0-9,]+ tokens/s", out_text)[1])  # type: ignore[index]
    manifest = json.loads((out / "manifest.json").read_text())
    return timed, wall, peak, manifest["num_tokens"] - manifest["num_documents"]


Result = tuple[float, float, float, int]  # timed s, wall s, peak MiB, tokens
FASTOKENS_ROW = "raw fastokens `encode_batch_flat` (in memory, 1 call, both cores): the fast engine's limit"


RAW_ROW = "raw `encode_batch` (in memory, 1 call, both cores)"
SLOW_ROWS = (RAW_ROW, "HF `datasets`", "litdata")  # no issue target: --full only (2 minutes of a run)


def run(quick: bool, hf_engine: bool = False, full: bool = False) -> str:
    from tokenloom.tokenize import build_stdlib_corpus, default_tokenizer_path

    tokenizer = str(default_tokenizer_path())
    copies = 4 if quick else 32
    rows: list[tuple[str, Result]] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-tokenize-") as tmp_name, ForkServers(_env(False)) as servers:
        tmp = Path(tmp_name)
        corpus = build_stdlib_corpus(tmp / "corpus")
        files = _make_inputs(tmp / "in", corpus.path, copies)
        file_list = ",".join(map(str, files))
        input_mb = sum(f.stat().st_size for f in files) / 1e6
        # identical files: a row that reads k of them has raw_tokens * k / copies tokens. The slow rows (HF
        # tokenizers' encode_batch, the two peers: 20-60 s a run over everything) read a part, for the run's time
        raw_copies = max(1, copies // 4)
        raw_list = ",".join(map(str, files[:raw_copies]))
        peer_copies = max(1, copies // 16)
        peer_list = ",".join(map(str, files[:peer_copies]))
        script = tmp / "litdata_child.py"
        script.write_text(_LITDATA)

        def child(cmd: list[str], parallel: bool) -> tuple[float, float, float, dict[str, int | float]]:
            wall, peak, out = _measure(cmd, _env(parallel))
            data = json.loads(out.strip().splitlines()[-1])
            return data["seconds"], wall, peak, data

        def raw(method: str) -> Result:
            timed, wall, peak, data = child([sys.executable, "-c", _RAW, raw_list, tokenizer, method], True)
            return timed, wall, peak, int(data["tokens"]) * copies // raw_copies

        def raw_fastokens() -> Result:
            timed, wall, peak, data = child([sys.executable, "-c", _RAW_FASTOKENS, file_list, tokenizer], True)
            return timed, wall, peak, int(data["tokens"])

        def peer(argv: list[str]) -> tuple[float, float, float, dict[str, int | float]]:
            """A peer's run forked from a server that did its imports: no process time (NaN), see _measure_forked."""
            peak, out = _measure_forked(servers, argv, _env(False))
            data = json.loads(out.strip().splitlines()[-1])
            return data["seconds"], math.nan, peak, data

        def hf_datasets() -> Result:
            cache = tmp / "hf-cache"
            timed, wall, peak, data = peer(["-c", _DATASETS, peer_list, tokenizer, str(cache)])
            shutil.rmtree(cache, ignore_errors=True)
            return timed, wall, peak, int(data["tokens"])

        def litdata() -> Result:
            out_dir = tmp / "litdata-out"
            timed, wall, peak, _ = peer([str(script), peer_list, tokenizer, str(out_dir)])
            shutil.rmtree(out_dir, ignore_errors=True)
            return timed, wall, peak, raw_tokens * peer_copies // copies

        contenders: list[tuple[str, Callable[[], Result]]] = [
            (RAW_ROW, lambda: raw("encode_batch")),
            (FASTOKENS_ROW, raw_fastokens),
            (
                "`tokenloom tokenize --num-workers 2` (engine auto: fast)",
                lambda: _tokenloom(tmp / "in", tmp / "out2", 2),
            ),
            ("HF `datasets` load_dataset + `.map(num_proc=2)`", hf_datasets),
            ("litdata `optimize` (2 workers, TokensLoader)", litdata),
        ]
        if hf_engine:  # the fallback engine: that encode_batch call in 2 workers (36 s of a full run, so opt-in)
            contenders.insert(
                3,
                (
                    "`tokenloom tokenize --num-workers 2 --engine hf`",
                    lambda: _tokenloom(tmp / "in", tmp / "outhf", 2, "hf"),
                ),
            )
        else:
            notes.append(
                "`--engine hf` (the fallback engine) is not in this run; `bench_tokenize.py --hf-engine` adds its row"
            )
        if quick or not full:  # the peers' imports and worker start-up alone take half a minute; no target
            why = "--quick" if quick else "default (no issue target): `--full` adds it"
            notes += [f"{name} not run by {why}" for name, _ in contenders if name.startswith(SLOW_ROWS)]
            contenders = [(name, measure) for name, measure in contenders if not name.startswith(SLOW_ROWS)]
        else:  # the peers' servers import side by side, before the first measurement
            servers.prestart(["-c", _DATASETS], [str(script)])
        results: dict[str, list[Result]] = {name: [] for name, _ in contenders}
        raw_tokens = 0  # set by the first raw run (the first contender), before litdata needs it
        # interleaved (A B C ... A B C ...), so that load from other processes drifts over all rows alike
        for _ in range(1 if quick else RUNS):
            for name, measure in contenders:
                if name in results:
                    try:
                        results[name].append(measure())
                        raw_tokens = raw_tokens or results[name][-1][3]
                    except (ImportError, RuntimeError, ValueError, KeyError) as exc:
                        notes.append(f"{name} not measured: {str(exc)[-300:]}")
                        del results[name]
        peer_tokens = raw_tokens * peer_copies // copies
        peers = ("HF `datasets`", "litdata")
        if full and not quick:
            notes.append(
                f"HF `datasets` and litdata read {peer_copies} of the {copies} files (identical copies); raw "
                f"`encode_batch` encodes {raw_copies} of them (its token count is scaled by {copies // raw_copies}); "
                "their tokens/s are over what they read"
            )
        for name, runs in results.items():
            tokens = peer_tokens if name.startswith(peers) else raw_tokens
            if any(r[3] != tokens for r in runs):
                notes.append(f"{name}: token count {runs[0][3]} differs from raw {tokens}")
            medians = tuple(_median([r[i] for r in runs]) for i in range(3))
            rows.append((name, (medians[0], medians[1], medians[2], tokens)))

        scale_rows = []
        for factor in (1, 4) if full and not quick else ():
            big = tmp / f"scale-{factor}"
            _make_inputs(big, corpus.path, copies * factor)
            timed, wall, peak, tokens = _tokenloom(big, tmp / f"scale-out-{factor}", 2)
            size_mb = sum(p.stat().st_size for p in big.iterdir()) / 1e6
            scale_rows.append((size_mb, tokens, timed, peak))
            shutil.rmtree(big)
            shutil.rmtree(tmp / f"scale-out-{factor}")

    measured = dict(rows)
    raw_rate = raw_tokens / measured[RAW_ROW][0] if RAW_ROW in measured else float("nan")
    fastokens_rate = raw_tokens / measured[FASTOKENS_ROW][0] if FASTOKENS_ROW in measured else float("nan")
    lines = [
        "## tokenize",
        "",
        f"Command: `uv run --group bench python tools/bench/bench_tokenize.py{' --quick' if quick else ''}"
        f"{' --full' if full else ''}`. "
        f"Input: {copies} copies of the stdlib docstring corpus ({input_mb:.0f} MB of jsonl in {copies} files, "
        f"{raw_tokens / 1e6:.1f} M document tokens); tokenizer: the shipped 16k byte-level BPE. "
        f"Each row runs in fresh processes, interleaved with the others, median of {1 if quick else RUNS}. "
        "Tokens/s counts "
        "document tokens (EOD excluded). *Timed* is what each contender times itself: raw, only the "
        "`encode_batch` (fastokens: `encode_batch_flat`) call over texts already in memory; tokenloom, the whole "
        "run as the command reports "
        "it (tokenizer load in a child, worker start, read, parse, encode, write, fsync, manifest), "
        "without interpreter start and imports; datasets, `load_dataset` + `.map` (after imports and "
        "tokenizer load); litdata, `optimize`. *Process* is the wall time of the whole process, "
        "imports included; the two peers run forked from a server that did their imports (4-8 s a run, outside "
        "their clocks), so they have no process time. Peak RSS is the process tree's, sampled every 50 ms (a "
        "forked peer's leaves out the library pages only its imports touched). The input is copies of one "
        "corpus, which favours any per-word cache in an encoder.",
        "",
        "| what | tokens/s timed | vs raw `encode_batch` | vs raw fastokens "
        "| tokens/s process | timed s | process s | peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, (timed, wall, peak, tokens) in rows:
        rate = tokens / timed
        ratios = " | ".join("-" if math.isnan(base) else f"{rate / base:.2f}x" for base in (raw_rate, fastokens_rate))
        process = "- | " if math.isnan(wall) else f"{tokens / wall / 1e6:.2f} M | "
        lines.append(
            f"| {name} | {rate / 1e6:.2f} M | {ratios} | {process}{timed:.1f} | "
            f"{'-' if math.isnan(wall) else f'{wall:.1f}'} | {peak:.0f} |"
        )
    if scale_rows:
        lines += [
            "",
            "Peak RSS of `tokenloom tokenize --num-workers 2` as the input grows (one run each):",
            "",
            "| input MB | tokens | timed s | peak RSS MiB |",
            "|---:|---:|---:|---:|",
        ]
        for size_mb, tokens, timed, peak in scale_rows:
            lines.append(f"| {size_mb:.0f} | {tokens / 1e6:.1f} M | {timed:.1f} | {peak:.0f} |")
    if notes:
        lines += ["", *[f"- {n}" for n in notes]]
    text = "\n".join(lines) + "\n"
    if not quick:
        OUTPUT.parent.mkdir(parents=True, exist_ok=True)
        OUTPUT.write_text(text)
    return text


RSS_OUTPUT = REPO / "docs" / "benchmarks" / "tokenize-rss.md"


def rss_scaling(sizes_mb: list[int]) -> str:
    """Peak RSS of ``tokenloom tokenize --num-workers 2`` for inputs of about ``sizes_mb`` MB each.

    Separate from :func:`run` because the 2 GB point alone takes minutes; its
    report goes to docs/benchmarks/tokenize-rss.md.
    """
    from tokenloom.tokenize import build_stdlib_corpus

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-tokenize-rss-") as tmp_name:
        tmp = Path(tmp_name)
        corpus = build_stdlib_corpus(tmp / "corpus")
        per_copy = corpus.path.stat().st_size / 1e6
        for size in sizes_mb:
            copies = max(1, round(size / per_copy))
            big = tmp / f"in-{size}"
            _make_inputs(big, corpus.path, copies)
            timed, _wall, peak, tokens = _tokenloom(big, tmp / f"out-{size}", 2)
            size_mb = sum(p.stat().st_size for p in big.iterdir()) / 1e6
            rows.append((size_mb, tokens, timed, peak))
            print(
                f"{size_mb:.0f} MB: {tokens / 1e6:.1f} M tokens in {timed:.0f} s, peak RSS {peak:.0f} MiB", flush=True
            )
            shutil.rmtree(big)
            shutil.rmtree(tmp / f"out-{size}")
    commit = subprocess.run(
        ["git", "-C", str(REPO), "log", "-1", "--format=%h (%cs)"], capture_output=True, text=True, check=False
    ).stdout.strip()
    lines = [
        "## tokenize: peak RSS as the input grows",
        "",
        "Command: `uv run python tools/bench/bench_tokenize.py --rss-scaling "
        + ",".join(map(str, sizes_mb))
        + "` (one run per size; copies of the stdlib docstring corpus; the process tree's peak RSS "
        f"sampled every 50 ms; 2 workers), run on commit {commit or 'unknown'}.",
        "",
        "| input MB | tokens | timed s | tokens/s | peak RSS MiB | vs smallest |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for size_mb, tokens, timed, peak in rows:
        lines.append(
            f"| {size_mb:,.0f} | {tokens / 1e6:,.1f} M | {timed:.0f} | {tokens / timed / 1e6:.2f} M "
            f"| {peak:.0f} | {peak / rows[0][3]:.2f}x |"
        )
    text = "\n".join(lines) + "\n"
    RSS_OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    RSS_OUTPUT.write_text(text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small input, a smoke run")
    parser.add_argument("--rss-scaling", metavar="MB,MB,...", help="only measure peak RSS at these input sizes")
    parser.add_argument("--full", action="store_true", help="add raw encode_batch, the peers, the 4x RSS point")
    parser.add_argument("--hf-engine", action="store_true", help="add the `--engine hf` row (36 s more here)")
    args = parser.parse_args()
    if args.rss_scaling:
        print(rss_scaling([int(x) for x in args.rss_scaling.split(",")]))
        return 0
    print(run(args.quick, hf_engine=args.hf_engine, full=args.full))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
