"""Benchmark tokenize as data preparation (#24): against the plain pipeline, across nodes, and its memory.

On >= 100 MB of text no one here wrote and not the demo corpus (the sources and docs of this
environment's site-packages: .py, .pyi, .md, .rst, .txt files, one document each, in jsonl
files of about 8 MB), with the shipped 16k byte-level BPE, each measurement in a fresh process:

- plain: one process per run that, per file, reads it, orjson-parses each line, calls fastokens
  ``encode_batch_flat`` on the file's texts, appends EOS after each document and writes uint16
  (the fastest plain pipeline; the issue's baseline). Timed from its tokenizer build to the last write, the
  scope of the time tokenloom reports (which includes its tokenizer load); whole-process times are shown too.
- ``tokenloom tokenize --num-workers 2`` (engine auto), timed as the command reports it.
- ``--num-nodes 2 --num-workers 1``: two node processes started together on this machine, the
  second finishing the manifest, vs ``--num-nodes 1 --num-workers 2`` (the same units).
- peak RSS of ``tokenize --num-workers 2`` on the corpus.
- ``--full`` only (no issue target; about two and a half minutes of a run here): HF ``datasets``
  ``load_dataset("json")`` + ``.map(num_proc=2)`` and litdata ``optimize`` (2 workers), the peers of
  bench_tokenize.py, on the first file of the same files (about 8 MB: at about 0.8 M tokens/s they took 90 s a round
  on all of them; tokens/s is what they are compared by), and peak RSS on about 2 GB (the corpus repeated as hard
  links in a temp dir).

Token counts (document tokens, EOS excluded) are checked equal between plain and every other row (the
peers against plain on their quarter).
``TOKENLOOM_PROFILE=DIR`` makes tokenize's workers write per-chunk time spans there (see
tokenloom.tokenize._profile); ``--profile`` prints the split of one run.

    uv run --group bench python tools/bench/bench_tokenize_prep.py [--quick | --full] [--profile DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _forkserver import ForkServers  # noqa: E402
from bench_tokenize import _LITDATA, _env, _measure, _measure_forked  # noqa: E402  (the peers, the RSS samplers)

REPO = HERE.parents[1]
OUTPUT = REPO / "docs" / "benchmarks" / "tokenize-prep.md"
RUNS = 3
SUFFIXES = (".py", ".pyi", ".md", ".rst", ".txt")
PART_BYTES = 8 << 20
ONE_NODE = "`tokenize --num-nodes 1 --num-workers 2` (unit-planned)"
TWO_NODES = "`tokenize --num-nodes 2 --num-workers 1` (2 node processes at once)"

_PLAIN = r"""
import json, sys, time, orjson, numpy as np
import fastokens
files, tokenizer, out, eos = sys.argv[1].split(","), sys.argv[2], sys.argv[3], int(sys.argv[4])
start = time.perf_counter()  # from the tokenizer build on: tokenloom's reported time includes its own
tok = fastokens.Tokenizer.from_file(tokenizer + "/tokenizer.json")
tokens = 0
with open(out, "wb") as sink:
    for path in files:
        with open(path, "rb") as handle:
            texts = [orjson.loads(line)["text"] for line in handle]
        ids, offsets = tok.encode_batch_flat(texts)
        flat = np.frombuffer(ids, dtype=np.uint32)
        ends = np.frombuffer(offsets, dtype=np.uint64).astype(np.int64)[1:]
        tokens += len(flat)
        sink.write(np.insert(flat, ends, eos).astype(np.uint16).tobytes())
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "tokens": tokens}))
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


def build_corpus(root: Path, target_bytes: int) -> list[Path]:
    """jsonl files of about PART_BYTES holding this environment's site-packages text, in sorted path order."""
    import site

    root.mkdir(parents=True, exist_ok=True)
    sources = sorted({Path(p) for p in site.getsitepackages() if Path(p).is_dir()})
    files: list[Path] = []
    part: list[bytes] = []
    size = total = 0

    def flush() -> None:
        nonlocal part, size
        if part:
            path = root / f"part-{len(files):04d}.jsonl"
            path.write_bytes(b"".join(part))
            files.append(path)
            part, size = [], 0

    for base in sources:
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(SUFFIXES) or "tokenloom" in dirpath:
                    continue
                path = Path(dirpath) / name
                try:
                    data = path.read_bytes()
                    text = data.decode("utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                if not text.strip() or len(data) > (1 << 20):
                    continue
                line = orjson.dumps({"text": text}) + b"\n"
                part.append(line)
                size += len(line)
                total += len(line)
                if size >= PART_BYTES:
                    flush()
                if total >= target_bytes:
                    flush()
                    return files
    flush()
    return files


def _eos(tokenizer: str) -> int:
    from tokenloom.tokenize import TokenizeConfig  # noqa: F401  (the package resolves the EOS id)
    from tokenloom.tokenize._tokenizer import local_info

    return int(local_info(tokenizer).eos_id)  # type: ignore[arg-type]


def _tokenize_cmd(input_dir: Path, out: Path, *extra: str, overwrite: bool = True) -> list[str]:
    cmd = [sys.executable, "-m", "tokenloom.formats", "tokenize", f"--input-dir={input_dir}", f"--output-dir={out}"]
    return [*cmd, "--no-progress", *(["--overwrite"] if overwrite else []), *extra]


def _timed(stdout: str) -> float:
    import re

    found = re.search(r"in ([0-9.]+) s", stdout)
    if found is None:
        raise RuntimeError(f"no timing in {stdout!r}")
    return float(found[1])


def _manifest_tokens(out: Path) -> int:
    manifest = json.loads((out / "manifest.json").read_text())
    return int(manifest["num_tokens"] - manifest["num_documents"])


Result = tuple[float, float, float, int]  # timed s, wall s, peak MiB, document tokens


def _two_nodes(input_dir: Path, out: Path) -> Result:
    """Two node processes side by side (1 worker each), as a 2-task Slurm array on one machine would run."""
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            _tokenize_cmd(input_dir, out, "--num-nodes=2", f"--node-rank={rank}", "--num-workers=1", overwrite=False),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_env(parallel=True),
        )
        for rank in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(err.decode()[-3000:])
    wall = time.perf_counter() - start
    return wall, wall, 0.0, _manifest_tokens(out)


def profile(input_dir: Path, out: Path, tmp: Path) -> str:
    """One tokenize --num-workers 2 run with the parent under cProfile and the workers' spans recorded."""
    spans = tmp / "spans"
    shutil.rmtree(spans, ignore_errors=True)
    spans.mkdir()
    stats = tmp / "parent.prof"
    env = {**_env(parallel=True), "TOKENLOOM_PROFILE": str(spans)}
    cmd = [sys.executable, "-m", "cProfile", "-o", str(stats), "-m", "tokenloom.formats", "tokenize"]
    cmd += [f"--input-dir={input_dir}", f"--output-dir={out}", "--num-workers=2", "--no-progress", "--overwrite"]
    wall, _peak, stdout = _measure(cmd, env)
    import pstats

    from tokenloom.tokenize._profile import summarize

    lines = [f"wall {wall:.2f} s; {stdout.strip().splitlines()[-1]}", "", summarize(spans), ""]
    report = pstats.Stats(str(stats))
    report.sort_stats("cumulative")
    import io

    buffer = io.StringIO()
    report.stream = buffer  # type: ignore[attr-defined]
    report.print_stats(25)
    lines.append(buffer.getvalue())
    return "\n".join(lines)


def run(quick: bool, full: bool = False) -> str:
    from tokenloom.tokenize import default_tokenizer_path

    peers = full and not quick
    tokenizer = str(default_tokenizer_path())
    eos = _eos(tokenizer)
    notes: list[str] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-tokenize-prep-") as tmp_name, ForkServers(_env(False)) as servers:
        tmp = Path(tmp_name)
        files = build_corpus(tmp / "in", (20 if quick else 110) * 10**6)
        input_dir = tmp / "in"
        file_list = ",".join(map(str, files))
        peer_files = files[: max(1, len(files) // 16)]  # the peers take about a minute a run over a quarter
        peer_list = ",".join(map(str, peer_files))
        peer_mb = sum(f.stat().st_size for f in peer_files) / 1e6
        input_mb = sum(f.stat().st_size for f in files) / 1e6
        script = tmp / "litdata_child.py"
        script.write_text(_LITDATA)

        def child(cmd: list[str], parallel: bool) -> tuple[float, float, float, dict[str, float]]:
            wall, peak, out = _measure(cmd, _env(parallel))
            data = json.loads(out.strip().splitlines()[-1])
            return data["seconds"], wall, peak, data

        def plain(listed: str = file_list) -> Result:
            timed, wall, peak, data = child(
                [sys.executable, "-c", _PLAIN, listed, tokenizer, str(tmp / "plain.bin"), str(eos)], True
            )
            return timed, wall, peak, int(data["tokens"])

        def tokenloom(*extra: str) -> Callable[[], Result]:
            def measure() -> Result:
                out = tmp / "out"
                wall, peak, stdout = _measure(_tokenize_cmd(input_dir, out, *extra), _env(parallel=True))
                return _timed(stdout), wall, peak, _manifest_tokens(out)

            return measure

        def peer(argv: list[str]) -> tuple[float, float, float, dict[str, float]]:
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
            return timed, wall, peak, peer_tokens

        plain_name = "plain pipeline (1 process: read, orjson, fastokens `encode_batch_flat`, EOS, uint16)"
        contenders: list[tuple[str, Callable[[], Result]]] = [
            (plain_name, plain),
            ("`tokenloom tokenize --num-workers 2`", tokenloom("--num-workers=2")),
            (ONE_NODE, tokenloom("--num-nodes=1", "--num-workers=2")),
            (TWO_NODES, lambda: _two_nodes(input_dir, tmp / "out")),
            ("HF `datasets` load_dataset + `.map(num_proc=2)`", hf_datasets),
            ("litdata `optimize` (2 workers, TokensLoader)", litdata),
        ]
        peer_names = {"HF `datasets` load_dataset + `.map(num_proc=2)`", "litdata `optimize` (2 workers, TokensLoader)"}
        if not peers:
            contenders = contenders[:4]
            notes.append(f"HF datasets and litdata not run by {'--quick' if quick else 'default (`--full` adds them)'}")
        else:
            notes.append(
                f"HF `datasets` and litdata read the first {len(peer_files)} of the {len(files)} files "
                f"({peer_mb:.0f} MB); their tokens/s and ratio are over those files' tokens"
            )
        peer_tokens = plain(peer_list)[3] if peers else 0
        if peers:  # the peers' servers import side by side, before the first measurement
            servers.prestart(["-c", _DATASETS], [str(script)])
        results: dict[str, list[Result]] = {name: [] for name, _ in contenders}
        plain_tokens = 0
        for _ in range(1 if quick else RUNS):  # interleaved, so load from other processes drifts over all rows
            for name, measure in contenders:
                if name in results:
                    try:
                        results[name].append(measure())
                        plain_tokens = plain_tokens or results[name][-1][3]
                    except (ImportError, RuntimeError, ValueError, KeyError) as exc:
                        notes.append(f"{name} not measured: {str(exc)[-300:]}")
                        del results[name]
        rows = []
        for name, runs in results.items():
            counts = {r[3] for r in runs}
            expected_tokens = peer_tokens if name in peer_names else plain_tokens
            if counts != {expected_tokens}:
                notes.append(f"{name}: token count {sorted(counts)} differs from plain {expected_tokens}")
            rows.append((name, (*(statistics.median(r[i] for r in runs) for i in range(3)), expected_tokens)))
        rss_rows = []
        for repeat in (1, 18) if full and not quick else (1,):  # about 110 MB and (--full) 2 GB
            big = tmp / f"rss-{repeat}"
            big.mkdir()
            for copy in range(repeat):
                for f in files:
                    os.link(f, big / f"c{copy:03d}-{f.name}")  # hard links: the same bytes, no extra disk
            out = tmp / f"rss-out-{repeat}"
            wall, peak, stdout = _measure(_tokenize_cmd(big, out, "--num-workers=2"), _env(parallel=True))
            size_mb = sum(p.stat().st_size for p in big.iterdir()) / 1e6
            big_files = ",".join(str(p) for p in sorted(big.iterdir()))
            plain_cmd = [sys.executable, "-c", _PLAIN, big_files, tokenizer, str(tmp / "plain-big.bin"), str(eos)]
            _wall, plain_peak, plain_out = _measure(plain_cmd, _env(parallel=True))
            (tmp / "plain-big.bin").unlink()
            plain_big = json.loads(plain_out.strip().splitlines()[-1])
            tokens = _manifest_tokens(out)
            if tokens != plain_big["tokens"]:
                notes.append(f"{size_mb:.0f} MB: tokenloom wrote {tokens} tokens, plain {plain_big['tokens']}")
            rss_rows.append((size_mb, tokens, _timed(stdout), peak, plain_big["seconds"], plain_peak))
            shutil.rmtree(big)
            shutil.rmtree(out)
    load_after = os.getloadavg()
    measured = {name: values for name, values in rows}
    plain_rate = plain_tokens / measured[plain_name][0] if plain_name in measured else float("nan")
    plain_process_rate = plain_tokens / measured[plain_name][1] if plain_name in measured else float("nan")
    lines = [
        "## tokenize: data preparation at cluster scale (#24)",
        "",
        f"Command: `uv run --group bench python tools/bench/bench_tokenize_prep.py{' --quick' if quick else ''}"
        f"{' --full' if full else ''}`. "
        f"Input: {input_mb:.0f} MB of jsonl in {len(files)} files, {plain_tokens / 1e6:.1f} M document tokens: "
        "the .py/.pyi/.md/.rst/.txt files of this environment's site-packages, one document each (not the demo "
        "corpus); tokenizer: the shipped 16k byte-level BPE. Fresh processes, rows interleaved, median of "
        f"{1 if quick else RUNS}. *Timed*: plain, from its tokenizer build (fastokens `from_file`) to its last "
        "write; tokenloom, the run as the command reports it (tokenizer load, workers, read, parse, encode, "
        "write, fsync, manifest); the 2-node row, "
        "both processes' wall time including interpreter start; datasets, `load_dataset` + `.map`; litdata, "
        "`optimize` (the two peers run forked from a server that did their imports, so they have no process time; "
        "their peak RSS leaves out the library pages only their imports touched). "
        f"Load average during the run: {load_before[0]:.1f} before, {load_after[0]:.1f} after "
        "(2 cores shared with other jobs).",
        "",
        "| what | tokens/s timed | vs plain | timed s | process s | vs plain (process s) | peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, (timed, wall, peak, tokens) in rows:
        rss = f"{peak:.0f}" if peak else "-"
        process = "- | -" if math.isnan(wall) else f"{wall:.2f} | {tokens / wall / plain_process_rate:.2f}x"
        lines.append(
            f"| {name} | {tokens / timed / 1e6:.2f} M | {tokens / timed / plain_rate:.2f}x | {timed:.2f} "
            f"| {process} | {rss} |"
        )
    one, two = measured.get(ONE_NODE), measured.get(TWO_NODES)
    if one and two:
        lines += [
            "",
            f"2 nodes x 1 worker vs 1 node x 2 workers: {one[1] / two[1]:.2f}x (process s, higher is faster).",
        ]
    if rss_rows:
        lines += [
            "",
            "Peak RSS of `tokenize --num-workers 2` as the input grows (the corpus repeated; one run each):",
            "",
            "| input MB | tokens | tokenloom timed s | plain timed s | vs plain | tokenloom peak RSS MiB "
            "| vs smallest | plain peak RSS MiB |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for size_mb, tokens, timed, peak, plain_s, plain_peak in rss_rows:
            ratio = peak / rss_rows[0][3]
            lines.append(
                f"| {size_mb:,.0f} | {tokens / 1e6:,.1f} M | {timed:.1f} | {plain_s:.1f} | {plain_s / timed:.2f}x "
                f"| {peak:.0f} | {ratio:.2f}x | {plain_peak:.0f} |"
            )
    if notes:
        lines += ["", *[f"- {n}" for n in notes]]
    text = "\n".join(lines) + "\n"
    if not quick:
        OUTPUT.parent.mkdir(parents=True, exist_ok=True)
        OUTPUT.write_text(text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20 MB, no peers, no 2 GB point: a smoke run")
    parser.add_argument("--profile", metavar="DIR", help="build the corpus in DIR (kept) and profile one run")
    parser.add_argument(
        "--full", action="store_true", help="add HF datasets, litdata and the 2 GB RSS point (minutes here)"
    )
    args = parser.parse_args()
    if args.profile:
        root = Path(args.profile)
        if not (root / "in").is_dir():
            build_corpus(root / "in", 110 * 10**6)
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        print(profile(root / "in", root / "out", root))
        return 0
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # as run.py: every process caches bytecode
    print(run(args.quick, full=args.full))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
