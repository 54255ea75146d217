"""Benchmark post-training data prep (#37): sft conversations -> sequence + loss_mask, and the packed SFT loader.

Conversations are generated deterministically (``random.Random(0)`` over the shipped 16k BPE's word tokens: a
system prompt half the time, 1-4 user/assistant turns, answers of 20-400 words) into jsonl files of about
8 MB: 3 MB in all by default (one run a row: run.py's share, under 90 s here), 55 MB and three runs a
row with ``--full`` (or ``TOKENLOOM_BENCH_SFT_FULL=1``), about 1 MB with ``--quick`` (a check that every row
runs). The tokenizer is the shipped BPE plus ``<|im_start|>`` and ``<|im_end|>``, with a ChatML template
written here that has ``{% generation %}`` tags (the peers need them; tokenloom does not). Each row runs as its own
process; wall seconds and CPU seconds (``getrusage`` of the whole tree, forkserver workers included) are
whole-process; "in-process" is the process's own clock after its imports, where it reports one.

- ``tokenloom tokenize --train-type sft --num-workers 2``: masks derived and every record verified, record store.
- plain: one process that orjson-parses, renders each conversation with ``apply_chat_template(tokenize=False)``,
  encodes the renderings with ``tokenizers``' ``encode_batch`` (offsets on), marks the tokens that start inside
  an assistant turn (found by ChatML's markers: the template's own knowledge) and writes uint16 + uint8.
  Target: tokenloom >= 0.8x its speed.
- TRL: ``SFTTrainer``'s dataset preparation (``_prepare_dataset`` with ``assistant_only_loss=True``,
  ``dataset_num_proc=2``) on ``load_dataset("json")``; and ``datasets.map(num_proc=2)`` calling
  ``apply_chat_template(return_assistant_tokens_mask=True)``. Target: tokenloom >= 3x.
- packed SFT loader: ``PackedSFTDataset(store, 2048)`` in a DataLoader (2 workers, batch 8, prefetch 4,
  persistent, tokenloom's ``collate``) vs a plain packed loader over the same bins with the same DataLoader
  settings: a map-style dataset whose ``__getitems__`` fills one preallocated storage (slice copies per
  conversation, labels by one masked copy over the batch) with the same five tensors (input_ids, labels -100
  where masked and across conversations, position_ids reset per conversation, doc_ids, cu_seqlens for
  varlen attention); the first batches of every run are checked equal to the other implementation's.
  Samples/s and CPU per sample (main process and workers, from /proc) over a window from the first batch
  on. Target: >= 1.0x.
  ``--loader-only`` runs only these rows (tokenize once for the store; nothing written).

Token and trained-token counts are checked equal between the rows.

    uv run --group bench python tools/bench/bench_sft.py [--quick | --full] [--loader-only]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tree_time import timed_tree

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
OUTPUT = REPO / "docs" / "benchmarks" / "sft.md"
PART_BYTES = 8 << 20
SEQ_LEN = 2048
TEMPLATE = (
    "{%- for message in messages -%}{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'assistant' -%}{% generation %}{{- message['content'] + '<|im_end|>' -}}"
    "{% endgeneration %}{%- else -%}{{- message['content'] + '<|im_end|>' -}}{%- endif -%}{{- '\\n' -}}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_PLAIN = r"""
import json, sys, time, orjson, numpy as np
from transformers import AutoTokenizer
files, tokdir, out = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
start = time.perf_counter()
tok = AutoTokenizer.from_pretrained(tokdir)
backend = tok.backend_tokenizer
head, end = "<|im_start|>assistant\n", "<|im_end|>"
tokens = trained = 0
with open(out + "/sequence.bin", "wb") as seq, open(out + "/loss_mask.bin", "wb") as lm:
    for path in files:
        with open(path, "rb") as handle:
            conversations = [orjson.loads(line)["messages"] for line in handle]
        texts = [tok.apply_chat_template(c, tokenize=False) for c in conversations]
        for text, encoding in zip(texts, backend.encode_batch(texts, add_special_tokens=False)):
            chars = np.zeros(len(text) + 1, dtype=np.uint8)
            at = text.find(head)
            while at >= 0:
                begin = at + len(head)
                stop = text.find(end, begin) + len(end)
                chars[begin:stop] = 1
                at = text.find(head, stop)
            ids = np.asarray(encoding.ids, dtype=np.uint16)
            mask = chars[np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2)[:, 0]]
            seq.write(ids.tobytes())
            lm.write(mask.tobytes())
            tokens += len(ids)
            trained += int(mask.sum())
print(json.dumps({"seconds": time.perf_counter() - start, "tokens": tokens, "trained": trained}))
"""

_TRL = r"""
import json, sys, time
files, tokdir, cache = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
from datasets import load_dataset, disable_progress_bars
from transformers import AutoTokenizer
from trl import SFTConfig, SFTTrainer
disable_progress_bars()
start = time.perf_counter()
tok = AutoTokenizer.from_pretrained(tokdir)
ds = load_dataset("json", data_files=files, split="train", cache_dir=cache)
trainer = SFTTrainer.__new__(SFTTrainer)  # the preparation only: no model
trainer._tokenizer, trainer.chat_template, trainer.completion_only_loss = tok, None, False
args = SFTConfig(output_dir=cache + "/trl", assistant_only_loss=True, dataset_num_proc=2, max_length=None,
                 report_to=[], use_cpu=True, bf16=False)
out = trainer._prepare_dataset(ds, tok, args, packing=False, formatting_func=None, dataset_name="train")
seconds = time.perf_counter() - start
labels = out["labels"]
print(json.dumps({"seconds": seconds, "tokens": sum(map(len, labels)),
                  "trained": sum(sum(1 for x in row if x != -100) for row in labels)}))
"""

_MAP = r"""
import json, sys, time
files, tokdir, cache = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
from datasets import load_dataset, disable_progress_bars
from transformers import AutoTokenizer
disable_progress_bars()
start = time.perf_counter()
tok = AutoTokenizer.from_pretrained(tokdir)
ds = load_dataset("json", data_files=files, split="train", cache_dir=cache)
def encode(batch):
    out = tok.apply_chat_template(batch["messages"], tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True)
    return {"input_ids": out["input_ids"], "assistant_masks": out["assistant_masks"]}
out = ds.map(encode, batched=True, num_proc=2, remove_columns=ds.column_names)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "tokens": sum(map(len, out["input_ids"])),
                  "trained": sum(map(sum, out["assistant_masks"]))}))
"""

_LOADER = r"""
import json, os, sys, time
import numpy as np, torch
from torch.utils.data import DataLoader
from tokenloom.datasets import PackedSFTDataset, collate
from tokenloom.formats import open_records
store, kind, seq_len, batches = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
IGNORE, CHECKED = -100, 3
packed = PackedSFTDataset(store, seq_len)

class Plain(torch.utils.data.Dataset):
    # the same bins and the same five tensors: per conversation slice copies into one preallocated storage,
    # labels by one masked copy over the whole batch (the fastest plain loop measured here)
    def __init__(self):
        (part,) = open_records(store).parts
        self.seq, self.mask = part.array("sequence"), part.array("loss_mask").view(np.bool_)
        off = np.asarray(part.offsets["sequence"], dtype=np.int64)
        self.bins = [[(int(off[c]), int(off[c + 1] - off[c])) for c in packed.conversations(i)]
                     for i in range(len(packed))]
        self.arange = np.arange(seq_len + 1, dtype=np.int64)
    def __len__(self):
        return len(self.bins)
    def __getitems__(self, indices):
        n, L, seq, mask, arange = len(indices), seq_len, self.seq, self.mask, self.arange
        raw = torch.empty(n * L * 32 + n * (L + 1) * 4, dtype=torch.uint8)
        wide = raw[: n * L * 32].view(torch.int64).view(4, n, L)
        cu_seqlens = raw[n * L * 32 :].view(torch.int32).view(n, L + 1)
        ids, labels, pos, docs = wide.numpy()
        cu = cu_seqlens.numpy()
        trained = np.zeros((n, L), dtype=np.bool_)
        cu.fill(L)
        ends = []
        for row, index in enumerate(indices):
            at = 0
            conversations = self.bins[index]
            for number, (begin, count) in enumerate(conversations):
                ids[row, at : at + count] = seq[begin : begin + count]
                trained[row, at : at + count] = mask[begin : begin + count]
                pos[row, at : at + count] = arange[:count]
                docs[row, at : at + count] = number
                cu[row, number] = at
                at += count
                ends.append(row * L + at - 1)
            if at < L:  # padding: pad id 0, one more segment
                ids[row, at:] = 0
                pos[row, at:] = arange[: L - at]
                docs[row, at:] = len(conversations)
                cu[row, len(conversations)] = at
        flat_labels, flat_ids = labels.reshape(-1), ids.reshape(-1)
        np.copyto(flat_labels[:-1], flat_ids[1:])
        np.copyto(flat_labels[:-1], IGNORE, where=~trained.reshape(-1)[1:])
        flat_labels[ends] = IGNORE  # a conversation's last token predicts nothing
        flat_labels[L - 1 :: L] = IGNORE  # nor a row's last
        return {"input_ids": wide[0], "labels": wide[1], "position_ids": wide[2], "doc_ids": wide[3],
                "cu_seqlens": cu_seqlens}

def cpu_seconds(pids):
    # user + system seconds of these processes so far (/proc: the DataLoader's workers are children)
    ticks = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")

plain = Plain()
dataset = packed if kind == "tokenloom" else plain
loader = DataLoader(dataset, batch_size=8, num_workers=2, collate_fn=collate if kind == "tokenloom" else (lambda b: b),
                    shuffle=False, drop_last=True, persistent_workers=True, prefetch_factor=4)
first, seen, done, start = [], 0, 0, None
while done < batches:  # epochs until `batches`; the clock starts at the first batch (after the workers start)
    for batch in loader:
        if start is None:
            pids = [os.getpid()] + [worker.pid for worker in loader._iterator._workers]
            start, cpu_start = time.perf_counter(), cpu_seconds(pids)
        else:
            seen += len(batch["input_ids"])
        if len(first) < CHECKED:
            first.append({key: value.clone() for key, value in batch.items()})
        done += 1
        if done >= batches:
            break
seconds, cpu = time.perf_counter() - start, cpu_seconds(pids) - cpu_start
# both loaders give the same tensors: the first batches against the other implementation's
other = plain.__getitems__ if kind == "tokenloom" else (lambda indices: packed.__getitems__(indices).batched)
for number, batch in enumerate(first):
    expected = other(list(range(8 * number, 8 * number + 8)))
    if batch.keys() != expected.keys() or not all(
        batch[key].dtype == expected[key].dtype and torch.equal(batch[key], expected[key]) for key in batch
    ):
        raise SystemExit(f"{kind}: batch {number} differs from the other loader's")
print(json.dumps({"seconds": seconds, "samples": seen, "per_second": seen / seconds, "cpu_per_sample": cpu / seen,
                  "checked": len(first), "load": os.getloadavg()[0]}))
"""


def make_tokenizer(root: Path) -> Path:
    from tokenizers import AddedToken, Tokenizer

    from tokenloom.tokenize import default_tokenizer_path

    directory = root / "tokenizer"
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.from_file(str(Path(default_tokenizer_path()) / "tokenizer.json"))
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ("<|im_start|>", "<|im_end|>")]
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "clean_up_tokenization_spaces": False, "chat_template": TEMPLATE}  # fmt: skip
    (directory / "tokenizer_config.json").write_bytes(orjson.dumps(config))
    return directory


def make_corpus(root: Path, tokenizer: Path, target_bytes: int) -> list[Path]:
    """Deterministic conversations in jsonl parts of about PART_BYTES (see the module docstring)."""
    vocab = orjson.loads((tokenizer / "tokenizer.json").read_bytes())["model"]["vocab"]
    words = sorted(w[1:] for w in vocab if w.startswith("\u0120") and w[1:].isalpha())
    rng = random.Random(0)
    root.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    lines: list[bytes] = []
    size = total = 0

    def text(low: int, high: int) -> str:
        return " ".join(rng.choices(words, k=rng.randint(low, high))) + rng.choice([".", "?", " 😀", " données.", ""])

    while total < target_bytes:
        messages = [{"role": "system", "content": text(3, 20)}] if rng.random() < 0.5 else []
        for _ in range(rng.randint(1, 4)):
            messages += [{"role": "user", "content": text(5, 80)}, {"role": "assistant", "content": text(20, 400)}]
        line = orjson.dumps({"messages": messages}) + b"\n"
        lines.append(line)
        size += len(line)
        total += len(line)
        if size >= PART_BYTES or total >= target_bytes:
            files.append(root / f"part-{len(files):04d}.jsonl")
            files[-1].write_bytes(b"".join(lines))
            lines, size = [], 0
    return files


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="true")
    return env


def timed(cmd: list[str]) -> tuple[float, float, str]:
    """(wall s, CPU s of the process and every descendant, forkserver workers included, stdout) of one subprocess."""
    wall, cpu, proc = timed_tree(cmd, _env())
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:5]} failed ({proc.returncode}): {proc.stderr.decode()[-3000:]}")
    return wall, cpu, proc.stdout.decode()


def _last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


#: Corpus megabytes, runs per prep row, loader runs per side and loader batches per run: --quick, the default
#: (run.py: under 90 s here), --full (the issue's >= 50 MB).
SIZES = {"quick": (1, 1, 1, 50), "default": (3, 1, 2, 1000), "full": (55, 3, 3, 3000)}


def measure_loader(store: Path, runs: int, batches: int) -> dict[str, list[tuple[float, float, dict]]]:
    """The packed SFT loader rows: tokenloom and plain alternately, ``runs`` each."""
    loader: dict[str, list[tuple[float, float, dict]]] = {}
    for _ in range(runs):
        for kind in ("tokenloom", "plain"):
            wall, cpu, stdout = timed([sys.executable, "-c", _LOADER, str(store), kind, str(SEQ_LEN), str(batches)])
            loader.setdefault(kind, []).append((wall, cpu, _last_json(stdout)))
    return loader


def measure(size: str, *, loader_only: bool = False) -> dict:
    megabytes, runs, loader_runs, batches = SIZES[size]
    tmp = Path(tempfile.mkdtemp(prefix="bench-sft-"))
    try:
        tokenizer = make_tokenizer(tmp)
        files = make_corpus(tmp / "in", tokenizer, megabytes << 20)
        data_mb = sum(f.stat().st_size for f in files) / 1e6
        joined = ",".join(map(str, files))
        out = tmp / "out"
        rows: dict[str, list[tuple[float, float, dict]]] = {}
        tokenize = [sys.executable, "-m", "tokenloom.formats", "tokenize", f"--input-dir={tmp / 'in'}",
                    f"--output-dir={out}", "--train-type=sft", f"--tokenizer={tokenizer}", "--num-workers=2",
                    "--no-progress", "--overwrite"]  # fmt: skip

        def tokenloom_counts(_stdout: str) -> dict:
            stats = orjson.loads((out / "post_training.json").read_bytes())["stats"]
            return {"tokens": stats["tokens"], "trained": stats["trained_tokens"]}

        if loader_only:  # the store only
            timed(tokenize)
        else:
            plain_out = tmp / "plain"
            plain_out.mkdir()
            contenders = [
                ("tokenloom `tokenize --train-type sft --num-workers 2`", tokenize, tokenloom_counts),
                ("plain (orjson, apply_chat_template, tokenizers offsets, masks, write)",
                 [sys.executable, "-c", _PLAIN, joined, str(tokenizer), str(plain_out)], _last_json),
            ]  # fmt: skip
            for name, code in (
                ("TRL SFTTrainer preparation (assistant_only_loss, 2 procs)", _TRL),
                ("datasets.map + apply_chat_template(return_assistant_tokens_mask), 2 procs", _MAP),
            ):  # a fresh cache per run: HF datasets would serve runs 2-3 from run 1's cache
                cache = str(tmp / f"cache-{len(contenders)}-@RUN@")
                contenders.append((name, [sys.executable, "-c", code, joined, str(tokenizer), cache], _last_json))
            failed: set[str] = set()
            for run in range(runs):  # rows interleaved: a round of every contender, then the next round
                for name, cmd, parse in contenders:
                    if name in failed:
                        continue
                    try:
                        wall, cpu, stdout = timed([part.replace("@RUN@", str(run)) for part in cmd])
                    except RuntimeError as exc:
                        if name == contenders[0][0]:
                            raise
                        failed.add(name)
                        rows[name] = [(float("nan"), float("nan"), {"error": str(exc).splitlines()[-1][:200]})]
                        continue
                    rows.setdefault(name, []).append((wall, cpu, parse(stdout)))
        loader = measure_loader(out, loader_runs, batches)
        load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
        return {"data_mb": data_mb, "files": len(files), "runs": runs, "rows": rows, "loader": loader, "load": load}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def report(result: dict) -> str:
    rows, loader = result["rows"], result["loader"]
    median = statistics.median
    lines = [
        "## Post-training data: sft prep and the packed SFT loader (#37)",
        "",
        f"{result['data_mb']:.1f} MB of generated conversations in {result['files']} jsonl files; medians of "
        f"{result['runs']} runs, the rows interleaved (a round of every row, then the next); whole-process wall and "
        "CPU seconds (CPU: the process and every descendant, tokenize's forkserver workers included); load average "
        f"(1/5/15 min) at the end {result['load']} on {os.cpu_count()} cores.",
    ]
    if rows:
        lines += [
            "",
            "| row | wall s | CPU s | in-process s | MB/s (wall) | tokenloom faster by (wall) | tokens | trained |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        ours = median(w for w, _, _ in next(iter(rows.values())))
        for name, runs in rows.items():
            info = runs[0][2]
            if "error" in info:
                lines.append(f"| {name} | failed: {info['error']} | | | | | | |")
                continue
            wall, cpu = median(w for w, _, _ in runs), median(c for _, c, _ in runs)
            inside = median(r[2]["seconds"] for r in runs) if "seconds" in info else None
            lines.append(
                f"| {name} | {wall:.2f} | {cpu:.2f} | {'' if inside is None else f'{inside:.2f}'} | "
                f"{result['data_mb'] / wall:.1f} | {wall / ours:.2f}x | {info['tokens']:,} | {info['trained']:,} |"
            )
        counts = {(r[0][2].get("tokens"), r[0][2].get("trained")) for r in rows.values() if "error" not in r[0][2]}
        lines += [
            "",
            f"Token and trained-token counts equal across rows: {'yes' if len(counts) == 1 else f'no {counts}'}.",
        ]
    runs = len(loader["tokenloom"])
    samples = loader["tokenloom"][0][2]["samples"]
    lines += [
        "",
        f"Packed SFT loader ({SEQ_LEN} tokens, batch 8, 2 workers, prefetch 4, persistent, in order; {runs} runs a "
        f"side, alternating; medians). Both give the same five tensors (input_ids, labels, position_ids, doc_ids "
        "int64, cu_seqlens int32), checked equal on the first batches of every run. In-process: a window of "
        f"{samples:,} samples from the first batch on; its CPU is the main process's and the workers' (/proc). "
        "The plain loader: a map-style dataset over the same bins whose `__getitems__` fills one preallocated "
        "storage by slice copies per conversation and labels by one masked copy over the batch; tokenloom's "
        "`collate` for tokenloom.",
        "",
        "| loader | samples/s (in-process) | CPU µs/sample (in-process) | wall s | CPU s | load (1 min) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    speed = {kind: median(r[2]["per_second"] for r in runs) for kind, runs in loader.items()}
    cost = {kind: median(r[2]["cpu_per_sample"] for r in runs) for kind, runs in loader.items()}
    for kind, runs in loader.items():
        wall, cpu = median(w for w, _, _ in runs), median(c for _, c, _ in runs)
        loads = " / ".join(f"{r[2]['load']:.1f}" for r in runs)
        lines.append(f"| {kind} | {speed[kind]:,.0f} | {cost[kind] * 1e6:,.0f} | {wall:.2f} | {cpu:.2f} | {loads} |")
    lines += [
        "",
        f"tokenloom / plain: {speed['tokenloom'] / speed['plain']:.2f}x the samples per second, "
        f"{cost['plain'] / cost['tokenloom']:.2f}x the samples per CPU second.",
    ]
    return "\n".join(lines) + "\n"


def run(quick: bool, *, full: bool = False, loader_only: bool = False) -> str:
    """run.py's entry: --quick 1 MB, else 3 MB (TOKENLOOM_BENCH_SFT_FULL=1 or --full: 55 MB, 3 runs a row)."""
    full = full or os.environ.get("TOKENLOOM_BENCH_SFT_FULL") == "1"
    text = report(measure("quick" if quick else "full" if full else "default", loader_only=loader_only))
    if not quick and not loader_only:
        OUTPUT.parent.mkdir(parents=True, exist_ok=True)
        OUTPUT.write_text(text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--full", action="store_true", help="55 MB of conversations, 3 runs a row (minutes)")
    parser.add_argument("--loader-only", action="store_true", help="the packed SFT loader rows only (not written)")
    args = parser.parse_args()
    sys.stdout.write(run(args.quick, full=args.full, loader_only=args.loader_only))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
