"""tokenloom's native format against the real GPT-Simple (``gpt-simple-lm`` 0.1.2), both ways.

gpt-simple-lm pins numpy < 2, so it runs in an isolated environment this module
builds once per session (``uv venv`` + ``uv pip install``; torch comes from uv's
cache). Its code runs there through ``gpt_simple_driver.py``.

- shards written by GPT-Simple's own pretokenize (``python -m gpt_simple.pretokenize``)
  open with ``open_dataset`` (fast validation, no manifest) with the entries and
  overlap prefixes GPT-Simple's own reader sees; adoption keeps them;
- shards written by ``tokenloom tokenize`` are read by GPT-Simple's
  ``PreTokenizedDataset``: its sequences are tokenloom's entries, its label masks
  honour tokenloom's overlap prefixes, its inventory counts agree;
- both with a uint16 vocabulary (the shipped 16k BPE) and a uint32 one (the same
  BPE plus 50,000 added tokens, some of which occur in the text).
"""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tokenloom.datasets import build_sample
from tokenloom.formats import open_buckets, open_dataset
from tokenloom.formats.native import adopt_native
from tokenloom.tokenize import TokenizeConfig, Windowing, default_tokenizer_path, tokenize

GPT_SIMPLE = "gpt-simple-lm==0.1.2"
DRIVER = Path(__file__).with_name("gpt_simple_driver.py")
TIMEOUT = 900
MAX_LENGTH = 48
OVERLAP = 12
EXTRA_TOKENS = 50_000
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _uv() -> str | None:
    found = shutil.which("uv")
    if found:
        return found
    try:
        from uv import find_uv_bin
    except ImportError:
        return None
    return find_uv_bin()


@pytest.fixture(scope="session")
def gpt_simple_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of an isolated environment holding gpt-simple-lm (built once per session)."""
    uv = _uv()
    if uv is None:
        pytest.skip("uv is not available: cannot build the isolated gpt-simple-lm environment")
    venv = tmp_path_factory.mktemp("gpt-simple") / "venv"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    steps = [[uv, "venv", "-q", "--python", version, str(venv)]]
    steps.append([uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), GPT_SIMPLE])
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=TIMEOUT, check=False, env=ENV)
        if done.returncode != 0:
            pytest.skip(f"cannot build the isolated gpt-simple-lm environment ({' '.join(step[:3])}): {done.stderr}")
    return venv / "bin" / "python"


def run_seed(python: Path, *jobs: dict) -> list:
    """Run GPT-Simple's code on ``jobs`` in one process of the isolated environment (see gpt_simple_driver)."""
    done = subprocess.run(
        [str(python), str(DRIVER), json.dumps(jobs)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        env=ENV,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


def tokenizer_dir(root: Path, vocab: str) -> Path:
    """The shipped 16k BPE (uint16), or the same plus 50,000 added tokens (vocabulary > 65,536: uint32)."""
    shipped = default_tokenizer_path()
    if vocab == "uint16":
        return shipped
    from tokenizers import Tokenizer

    target = root / "tokenizer-66k"
    target.mkdir()
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(shipped / name, target / name)
    tokenizer = Tokenizer.from_file(str(shipped / "tokenizer.json"))
    tokenizer.add_tokens([f"<x{i}>" for i in range(EXTRA_TOKENS)])
    tokenizer.save(str(target / "tokenizer.json"))
    return target


def corpus(directory: Path, vocab: str) -> Path:
    """Two jsonl shards: short and long documents (windowed at MAX_LENGTH), one empty text."""
    rng = random.Random(7)
    words = [
        "the",
        "data",
        "loader",
        "reads",
        "tokens",
        "from",
        "shards",
        "and",
        "packs",
        "documents",
        "into",
        "windows",
    ]
    directory.mkdir(parents=True)
    for shard in range(2):
        lines = []
        for doc in range(25):
            text = " ".join(rng.choice(words) for _ in range(rng.choice([3, 10, 30, 90])))
            if vocab == "uint32" and doc % 3 == 0:
                text += f" <x{EXTRA_TOKENS - 1 - doc}> end"  # ids above 65,535
            lines.append(json.dumps({"text": text if doc != 4 else ""}))
        (directory / f"{shard:05d}.jsonl").write_text("\n".join(lines) + "\n")
    return directory


def packed_groups(entries: list[list[int]], max_length: int) -> list[list[list[int]]]:
    """Consecutive entries grouped into sequences of at most ``max_length`` tokens (two or more where they fit)."""
    groups: list[list[list[int]]] = [[]]
    for entry in entries:
        if groups[-1] and sum(map(len, groups[-1])) + len(entry) > max_length:
            groups.append([])
        groups[-1].append(entry)
    return [g for g in groups if g]


def expected_labels(tokens: list[int], overlap: int) -> list[int]:
    """GPT-Simple's labels for one unpacked entry: the overlap prefix masked (the EOD, if any, is last)."""
    return [-100] * overlap + tokens[overlap:]


@pytest.mark.parametrize("vocab", ["uint16", "uint32"])
def test_tokenloom_reads_what_gpt_simple_pretokenizes(tmp_path: Path, gpt_simple_python: Path, vocab: str) -> None:
    tokenizer = tokenizer_dir(tmp_path, vocab)
    bucket = tmp_path / "tokenized" / "train" / "web"
    argv = ["--input_dir", str(corpus(tmp_path / "raw", vocab)), "--output_dir", str(bucket)]
    argv += ["--tokenizer_path", str(tokenizer), "--max_length", str(MAX_LENGTH), "--overlap_size", str(OVERLAP)]
    argv += ["--min_text_length", "1"]
    _, seed = run_seed(gpt_simple_python, {"op": "pretokenize", "argv": argv}, {"op": "entries", "dir": str(bucket)})
    assert sorted(p.name for p in bucket.iterdir()) == ["00000.bin", "00000.idx", "00001.bin", "00001.idx"]
    assert set(seed["dtype_codes"]) == {2 if vocab == "uint16" else 4}
    assert any(overlap > 0 for _, overlap in seed["entries"])  # long documents were windowed
    if vocab == "uint32":
        assert max(max(tokens) for tokens, _ in seed["entries"]) > 65_535

    ds = open_dataset(bucket)  # no manifest: fast structural validation
    assert ds.format == "native" and ds.dtype.name == vocab
    assert [ds[i].tolist() for i in range(len(ds))] == [tokens for tokens, _ in seed["entries"]]
    assert ds.overlap_prefix.tolist() == [overlap for _, overlap in seed["entries"]]
    assert list(open_buckets(tmp_path / "tokenized")) == ["web"]

    adopt_native(bucket)
    adopted = open_dataset(bucket, validate="deep")
    assert [adopted[i].tolist() for i in range(len(adopted))] == [tokens for tokens, _ in seed["entries"]]


@pytest.mark.parametrize("vocab", ["uint16", "uint32"])
def test_gpt_simple_trains_on_what_tokenloom_tokenizes(tmp_path: Path, gpt_simple_python: Path, vocab: str) -> None:
    out = tmp_path / "train" / "web"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tokenloom.formats",
            "tokenize",
            "--input-dir",
            str(corpus(tmp_path / "raw", vocab)),
            "--output-dir",
            str(out),
            "--tokenizer",
            str(tokenizer_dir(tmp_path, vocab)),
            "--seq-len",
            str(MAX_LENGTH),
            "--overlap-size",
            str(OVERLAP),
            "--shard-size-tokens",
            "400",
            "--num-workers",
            "0",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        env=ENV,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    ds = open_dataset(out, validate="deep")
    assert ds.dtype.name == vocab and ds.num_shards > 1
    ours = [(ds[i].tolist(), int(ds.overlap_prefix[i])) for i in range(len(ds))]
    assert any(overlap > 0 for _, overlap in ours)

    eos = int(ds.eos_id or 0)
    sampling = {"op": "samples", "dir": str(out), "max_length": MAX_LENGTH, "eod": eos, "pad": eos}
    sequences = packed_groups([tokens for tokens, overlap in ours if overlap == 0], MAX_LENGTH)
    seed, inventory, unpacked, packed, finalized = run_seed(
        gpt_simple_python,
        {"op": "entries", "dir": str(out)},
        {"op": "inspect", "dir": str(out)},
        {**sampling, "pack": False},
        {**sampling, "pack": True},
        {"op": "finalize", "sequences": sequences, "max_length": MAX_LENGTH, "eod": eos, "pad": eos},
    )
    assert [tuple(entry) for entry in seed["entries"]] == ours
    assert inventory == {"shards": ds.num_shards, "tokens": ds.num_tokens, "docs": len(ds)}

    expected = Counter(json.dumps([tokens, expected_labels(tokens, overlap)]) for tokens, overlap in ours)
    assert Counter(json.dumps([item["input_ids"], item["labels"]]) for item in unpacked) == expected
    assert all(item["position_ids"] == list(range(len(item["input_ids"]))) for item in unpacked)

    # tokenloom's pack_sequences="gpt-simple" rules against GPT-Simple's own _finalize_sequence:
    # same positions and doc_ids; tokenloom's labels are shifted (label t = token t + 1), GPT-Simple's
    # are shifted by its model (target t = labels[t + 1]): the same targets, the same masked ones
    assert len(finalized) == len(sequences) > 3
    for docs, theirs in zip(sequences, finalized, strict=True):
        content = [t for doc in docs for t in doc]
        ours_sample = build_sample(np.array([*content, eos]), eos_id=eos, packing="gpt-simple")
        assert ours_sample["input_ids"].tolist() == theirs["input_ids"] == content
        assert ours_sample["position_ids"].tolist() == theirs["position_ids"]
        assert ours_sample["doc_ids"].tolist() == theirs["doc_ids"]
        assert ours_sample["labels"].tolist()[:-1] == theirs["labels"][1:]

    assert all(len(item["input_ids"]) <= MAX_LENGTH for item in packed)
    assert Counter(t for item in packed for t in item["input_ids"]) == Counter(t for tokens, _ in ours for t in tokens)


# -- `tokenloom tokenize --windowing gpt-simple` against GPT-Simple's own pretokenize --------------------

#: (max_length, overlap_size, min_text_length; None = GPT-Simple's default, 200 characters)
WINDOWINGS = [(16, 0, None), (16, 4, 0), (16, 10, 0), (16, 20, 1), (2, 1, 0)]
LONGEST = 10_050  # with max_length 2 and overlap 1 (stride 1) GPT-Simple stops this one at 10,001 windows


def text_of_length(tokenizer, target: int, marker: str) -> str:
    """A text the tokenizer encodes to exactly ``target`` ids (``marker``, an added token, where there is room)."""
    for k in range(target, -1, -1):
        text = " ".join(([marker] if marker and target > 4 else []) + ["data"] * k)
        found = len(tokenizer.encode(text, add_special_tokens=False).ids)
        if found == target:
            return text
        if found < target:
            break
    raise AssertionError(f"no text of {target} tokens")


def windowing_corpus(directory: Path, tokenizer_path: Path, vocab: str) -> tuple[Path, list[int]]:
    """Documents of 15, 16, 17 (max_length 16 - 1, = and + 1), 115 (many times), 0, 1, 2, 3 and LONGEST tokens."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path / "tokenizer.json"))
    marker = f"<x{EXTRA_TOKENS - 1}>" if vocab == "uint32" else ""
    lengths = [15, 16, 17, 115, 0, 1, 2, 3, LONGEST, 40, 41]
    texts = [text_of_length(tokenizer, n, marker) if n else "" for n in lengths]
    directory.mkdir(parents=True)
    # one file (GPT-Simple loads its tokenizer once per file, seconds for the 66k one), gzipped
    data = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    (directory / "00000.jsonl.gz").write_bytes(gzip.compress(data, mtime=0))
    return directory, lengths


@pytest.mark.parametrize("vocab", ["uint16", "uint32"])
def test_tokenize_windowing_gpt_simple_is_gpt_simples_pretokenize_exactly(
    tmp_path: Path, gpt_simple_python: Path, vocab: str
) -> None:
    tokenizer = tokenizer_dir(tmp_path, vocab)
    raw, lengths = windowing_corpus(tmp_path / "raw", tokenizer, vocab)
    jobs = []
    for max_length, overlap, min_chars in WINDOWINGS:
        seed_dir = tmp_path / f"seed-{max_length}-{overlap}"
        argv = ["--input_dir", str(raw), "--output_dir", str(seed_dir), "--tokenizer_path", str(tokenizer)]
        argv += ["--max_length", str(max_length), "--overlap_size", str(overlap)]
        argv += [] if min_chars is None else ["--min_text_length", str(min_chars)]
        jobs += [{"op": "pretokenize", "argv": argv}, {"op": "entries", "dir": str(seed_dir)}]
    if vocab == "uint16":  # GPT-Simple's line reading and <|pad|>: one more small directory each, same process
        lines_dir, pad_dir = reading_corpus(tmp_path)
        for source in (lines_dir, pad_dir):
            argv = ["--input_dir", str(source), "--output_dir", str(tmp_path / f"seed-{source.name}")]
            argv += ["--tokenizer_path", str(tokenizer), "--max_length", "16", "--overlap_size", "4"]
            argv += ["--min_text_length", "0"]
            jobs += [
                {"op": "pretokenize", "argv": argv},
                {"op": "entries", "dir": str(tmp_path / f"seed-{source.name}")},
            ]
    seed_results = run_seed(gpt_simple_python, *jobs)[1::2]
    if vocab == "uint16":
        seed_results, (seed_lines, seed_pad) = seed_results[: len(WINDOWINGS)], seed_results[len(WINDOWINGS) :]
        check_reading(tmp_path, tokenizer, lines_dir, seed_lines, pad_dir, seed_pad)

    for number, ((max_length, overlap, min_chars), seed) in enumerate(zip(WINDOWINGS, seed_results, strict=True)):
        out = tmp_path / f"ours-{max_length}-{overlap}"
        min_text_length = 200 if min_chars is None else min_chars
        if number == 0 and vocab == "uint16":  # the command line once; the rest through the API (one tokenizer load)
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tokenloom.formats",
                    "tokenize",
                    *("--input-dir", str(raw), "--output-dir", str(out), "--tokenizer", str(tokenizer)),
                    *("--seq-len", str(max_length), "--overlap-size", str(overlap), "--windowing", "gpt-simple"),
                    *("--min-text-length", str(min_text_length), "--num-workers", "0", "--no-progress"),
                ],
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
                check=False,
                env=ENV,
            )
            assert done.returncode == 0, done.stderr[-4000:]
        else:
            config = TokenizeConfig(
                input_dir=raw,
                output_dir=out,
                tokenizer=str(tokenizer),
                seq_len=max_length,
                overlap_size=overlap,
                windowing=Windowing.GPT_SIMPLE,
                min_text_length=min_text_length,
                num_workers=0,
            )
            tokenize(config)
        ds = open_dataset(out, validate="deep")
        ours = [[ds[i].tolist(), int(ds.overlap_prefix[i])] for i in range(len(ds))]
        case = f"max_length {max_length}, overlap {overlap}, min_text_length {min_chars}"
        assert ours == seed["entries"], case
        assert set(seed["dtype_codes"]) == {2 if vocab == "uint16" else 4} and ds.dtype.name == vocab, case
        seed_bytes = b"".join(p.read_bytes() for p in sorted((tmp_path / f"seed-{max_length}-{overlap}").glob("*.bin")))
        our_bytes = b"".join(p.read_bytes() for p in sorted(out.glob("unit_*.bin")))
        assert our_bytes == seed_bytes, case
        # what the cases cover, so that the comparison above cannot pass vacuously
        entry_lengths = [len(tokens) for tokens, _ in ours]
        if min_chars is None:  # GPT-Simple's default --min_text_length 200 dropped the short documents
            assert len(ours) < len(seed_results[1]["entries"])
        if max_length == 16 and min_chars is not None:
            assert max_length + 1 in entry_lengths  # a last window holding max_length tokens + EOD
            assert any(tokens[-1] != ds.eos_id for tokens, _ in ours)  # windows without EOD
        if overlap > max_length // 2:  # stride max_length // 2, yet the recorded prefix is min(overlap, window)
            assert min(overlap, max_length) in {prefix for _, prefix in ours}
        if max_length == 2:
            assert len(ours) > 10_001 and sum(1 for n in lengths if n) < len(ours)
            summary = json.loads((out / "manifest.json").read_text())["metadata"]["tokenize"]
            assert summary["dropped"] == {"no_tokens": 1, "truncated": 1}


def reading_corpus(root: Path) -> tuple[Path, Path]:
    """Lines GPT-Simple reads its own way (text mode, ``line.strip()``, ``json.loads``); a literal <|pad|>."""
    lines = root / "lines"
    lines.mkdir()
    data = (
        b'{"text": "plain words here", "score": NaN}\r\n'  # NaN and a \r\n ending
        b'{"text": "form feed after", "x": Infinity}\x0c\n'  # json.loads only; \x0c stripped
        b'\xc2\xa0{"text": "no-break spaces around"}\xc2\xa0\n'  # U+00A0 stripped by str.strip()
        b"\n"  # blank
        b"\x0c \xc2\xa0\r\n"  # blank after str.strip()
        b'{"title": "no text field"}\n'
        b'{"text": "not json",}\n'  # json.loads rejects it too: GPT-Simple skips it
        b'{"text": "last line, no newline, \\r escaped"}'
    )
    (lines / "00000.jsonl").write_bytes(data)
    pad = root / "pad"
    pad.mkdir()
    (pad / "00000.jsonl").write_text(json.dumps({"text": "before <|pad|> after"}) + "\n")
    return lines, pad


def check_reading(tmp_path: Path, tokenizer: Path, lines: Path, seed_lines: dict, pad: Path, seed_pad: dict) -> None:
    """Same entries as GPT-Simple for the odd lines, each skip counted; <|pad|> refused (GPT-Simple: one new id)."""
    from tokenloom.formats import RecordError

    common = {"tokenizer": str(tokenizer), "seq_len": 16, "overlap_size": 4, "windowing": Windowing.GPT_SIMPLE}
    config = TokenizeConfig(
        input_dir=lines, output_dir=tmp_path / "ours-lines", on_error="skip", num_workers=0, **common
    )
    summary = tokenize(config)
    ds = open_dataset(tmp_path / "ours-lines", validate="deep")
    ours = [[ds[i].tolist(), int(ds.overlap_prefix[i])] for i in range(len(ds))]
    assert ours == seed_lines["entries"]
    assert len(ours) == 4  # the NaN, Infinity, no-break-space and last records, each one window + EOD
    assert summary.dropped == {"blank_line": 2, "no_text_field": 1}
    assert summary.skipped == {"malformed_json": 1}
    # GPT-Simple wrote the literal <|pad|> as the id it added (the vocabulary size), which tokenloom refuses
    assert [summary.vocab_size in tokens for tokens, _ in seed_pad["entries"]] == [True]
    with pytest.raises(RecordError, match=r"<\|pad\|>") as caught:
        tokenize(TokenizeConfig(input_dir=pad, output_dir=tmp_path / "ours-pad", num_workers=0, **common))
    assert caught.value.record == 1


# -- the curriculum's budget_unit: loss_tokens counts as GPT-Simple's training loop does ------------------


def test_curriculum_loss_tokens_gives_gpt_simples_phase_lengths(tmp_path: Path, gpt_simple_python: Path) -> None:
    """GPT-Simple's _train_loop counts (labels != -100).sum() of each batch and ends a phase at the first step
    where the phase's own count reaches duration_tokens (then counts from zero). Here GPT-Simple's own
    _finalize_sequence labels every sample tokenloom yields; its rule, one sample per step, must cut the phases
    where tokenloom's plan does under budget_unit: loss_tokens (and not under the default input_tokens)."""
    import yaml

    from tokenloom.curriculum import CurriculumConfig, CurriculumDataset
    from tokenloom.formats import open_writer

    eos, max_length = 65535, 16
    root = tmp_path / "data"
    for split, total in (("train", 6000), ("val", 64)):
        for number, (name, length) in enumerate({"web": 8, "code": 4, "books": 16}.items()):
            with open_writer(root / split / name, dtype="uint16", eos_id=eos, vocab_size=65536) as writer:
                for doc in range(total // length):
                    tokens = (np.arange(length) + doc * length + number * 1000) % 60000
                    tokens[-1] = eos
                    writer.add(tokens)
    durations = [1000, 1500, 900, 600]
    data = {
        "path": str(root),
        "max_length": max_length,
        "packing": True,
        "curriculum": [
            {"duration_tokens": durations[0], "mix": {"web": 1, "code": 1}},
            {"duration_tokens": durations[1], "mix": {"web": 0.2, "code": 0.3, "books": 0.5}},
            {"duration_tokens": durations[2], "mix": {"books": 0.6, "code": 0.4}},
            {"duration_tokens": durations[3], "mix": {"web": 1}},
        ],
    }
    ends = {}
    for unit in ("input_tokens", "loss_tokens"):
        config_path = tmp_path / f"{unit}.yaml"
        config_path.write_text(yaml.safe_dump({"data": {**data, "budget_unit": unit}}))
        ds = CurriculumDataset(CurriculumConfig.from_file(config_path), seed=11, plan_cache_dir=tmp_path / "cache")
        ends[unit] = ([end for _, end in ds.schedule.phase_bounds], ds)
    ds = ends["loss_tokens"][1]
    batch = ds.__getitems__(list(range(len(ds)))).batched
    lengths = ds.budget_tokens(np.arange(len(ds)), "input_tokens").tolist()
    sequences = []
    for row, n in zip(batch["input_ids"].tolist(), lengths, strict=True):
        content, docs = row[:n], []
        while content:
            cut = content.index(eos) + 1 if eos in content else len(content)
            docs.append(content[:cut])
            content = content[cut:]
        sequences.append(docs)
    (finalized,) = run_seed(
        gpt_simple_python,
        {"op": "finalize", "sequences": sequences, "max_length": max_length, "eod": eos, "pad": eos},
    )
    per_sample = [sum(label != -100 for label in item["labels"]) for item in finalized]
    assert [item["input_ids"] for item in finalized] == [
        row[:n] for row, n in zip(batch["input_ids"].tolist(), lengths, strict=True)
    ]
    assert ds.budget_tokens(np.arange(len(ds))).tolist() == per_sample  # tokenloom's unit is GPT-Simple's count
    assert set(per_sample) == {15, 13, 16}  # web: 2 documents per sequence, code: 4, books: 1

    seed_ends, phase, consumed = [], 0, 0  # GPT-Simple's phase rule (_train_loop.py), one sample per step
    for position, tokens in enumerate(per_sample):
        if phase == len(durations) - 1:
            break
        consumed += tokens
        if consumed >= durations[phase]:
            seed_ends.append(position + 1)
            phase, consumed = phase + 1, 0
    assert ends["loss_tokens"][0][:-1] == seed_ends
    assert ends["input_tokens"][0][:-1] != seed_ends
    assert ends["input_tokens"][0][0] < seed_ends[0]  # counting input tokens ends phase 0 early (the report)
