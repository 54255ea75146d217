"""Where tokenize's peak RSS grows with the input: tokenloom's pipeline, or the encoder inside it?

Runs ``tokenloom.tokenize.tokenize`` in fresh processes on the bench_tokenize_prep corpus (about 110 MB of
site-packages text) and on that corpus repeated (hard links), and prints the peak RSS of each run:

- ``real``: the fast engine as shipped (fastokens), ``--num-workers`` as given;
- ``stand-in``: the same pipeline (read, parse, window, write, manifest) with fastokens' ``encode_batch_flat``
  replaced by a stand-in that returns one id per 3 characters: what remains is tokenloom's own memory.

    uv run --group bench python tools/bench/tokenize_rss_ablation.py [--repeats 1,6] [--workers 0,2]

``FASTOKENS_BPE_THREADS`` and ``MALLOC_ARENA_MAX`` pass through to the runs, to try them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_tokenize_prep import build_corpus  # noqa: E402

_CHILD = r"""
import sys, threading, time
import numpy as np
from tokenloom.tokenize import TokenizeConfig, default_tokenizer_path, tokenize
from tokenloom.tokenize import engine

def rss():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024
    return 0

if sys.argv[3] == "stand-in":
    def stand_in(self, texts):
        lengths = np.array([max(1, len(text) // 3) for text in texts], dtype=np.int64)
        offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return np.ones(int(offsets[-1]), dtype=np.uint32), offsets
    engine.FastEncoder.encode_flat = stand_in

peak, done = [0], [False]
def watch():
    while not done[0]:
        peak[0] = max(peak[0], rss())
        time.sleep(0.05)
threading.Thread(target=watch, daemon=True).start()
tokenize(TokenizeConfig(input_dir=sys.argv[1], output_dir=sys.argv[2], tokenizer=str(default_tokenizer_path()),
                        num_workers=int(sys.argv[4]), engine="fast", overwrite=True))
done[0] = True
print(max(peak[0], rss()))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", default="1,6", help="corpus copies per run (1: about 110 MB)")
    parser.add_argument("--workers", default="0,2", help="--num-workers values")
    args = parser.parse_args()
    repeats = [int(r) for r in args.repeats.split(",")]
    workers = [int(w) for w in args.workers.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-rss-ablation-") as name:
        tmp = Path(name)
        files = build_corpus(tmp / "corpus", 110 * 10**6)
        inputs = {}
        for repeat in repeats:
            inputs[repeat] = tmp / f"in-{repeat}"
            inputs[repeat].mkdir()
            for copy in range(repeat):
                for path in files:
                    os.link(path, inputs[repeat] / f"c{copy:03d}-{path.name}")
        print("| encoder | --num-workers | " + " | ".join(f"{r}x corpus, peak MiB" for r in repeats) + " | growth |")
        print("|---|---:|" + "---:|" * len(repeats) + "---:|")
        for mode in ("stand-in", "real"):
            for worker_count in workers:
                peaks = []
                for repeat in repeats:
                    started = time.perf_counter()
                    done = subprocess.run(
                        [sys.executable, "-c", _CHILD, str(inputs[repeat]), str(tmp / "out"), mode, str(worker_count)],
                        capture_output=True, text=True, check=True,
                    )  # fmt: skip
                    peaks.append(int(done.stdout.strip().splitlines()[-1]))
                    seconds = time.perf_counter() - started
                    sys.stderr.write(f"{mode} workers={worker_count} x{repeat}: {seconds:.1f} s\n")
                cells = " | ".join(str(p) for p in peaks)
                print(f"| {mode} | {worker_count} | {cells} | {peaks[-1] / peaks[0]:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
