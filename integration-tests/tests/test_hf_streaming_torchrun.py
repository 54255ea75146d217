"""StreamingHuggingFaceDataset under torchrun: SIGKILL, then resume bit-exact on the same
topology and exactly once (doc_index oracle) on another one.

The oracle rebuilds every document from the logged windows (the token provenance says
which document each token comes from) and compares it with the shipped tokenizer's own
encoding of the document plus EOS: every document's tokens once, in order, nothing else.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path

import orjson
import pytest
from tokenizers import Tokenizer
from torchrun_helpers import finish_job, kill_job, start_job, tokenloom_cli

from tokenloom.hf_streaming import StreamingHuggingFaceDataset
from tokenloom.tokenize import default_tokenizer_path

SEQ_LEN, CHECKPOINT_STEP, COMPARE_STEPS = 32, 6, 4
WORDS = (  # noqa: SIM905 (a word list, not code)
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma"
).split()


def write_corpus(root: Path) -> list[str]:
    root.mkdir(parents=True)
    files = []
    for f in range(2):
        lines = []
        for i in range(70):
            n = 5 + (i * 37 + f * 11) % 60  # documents from a few tokens to several windows long
            text = f"doc {f}-{i}: " + " ".join(WORDS[(i + k * 7) % len(WORDS)] for k in range(n))
            lines.append(orjson.dumps({"id": f"{f}-{i}", "text": text}))
        path = root / f"part{f}.jsonl"
        path.write_bytes(b"\n".join(lines) + b"\n")
        files.append(str(path))
    return files


def expected_documents(files: list[str], eos_id: int) -> dict[int, list[int]]:
    """doc_index -> the tokenizer's ids + EOS; doc_index = file << 40 | byte offset of the line."""
    tokenizer = Tokenizer.from_file(str(Path(default_tokenizer_path()) / "tokenizer.json"))
    texts = {}
    for f, path in enumerate(files):
        offset = 0
        for line in Path(path).read_bytes().splitlines(keepends=True):
            texts[f << 40 | offset] = orjson.loads(line)["text"]
            offset += len(line)
    encoded = tokenizer.encode_batch(list(texts.values()), add_special_tokens=False)
    return {key: [*e.ids, eos_id] for key, e in zip(texts, encoded, strict=True)}


def records(out: Path) -> list[dict]:
    found = []
    for path in sorted(out.glob("rank*.jsonl")):
        found += [orjson.loads(line) for line in path.read_bytes().splitlines()]
    return found


def rebuild(segments: list[list[dict]]) -> dict[int, list[int]]:
    """doc_index -> its tokens in emission order (each window = input_ids + the last label)."""
    docs: dict[int, list[int]] = collections.defaultdict(list)
    for segment in segments:
        for record in sorted(segment, key=lambda r: (r["rank"], r["step"])):
            for ids, labels, doc, label_doc in zip(
                record["input_ids"], record["labels"], record["doc_index"], record["label_doc_index"], strict=True
            ):
                for token, d in zip([*ids, labels[-1]], [*doc, label_doc[-1]], strict=True):
                    if d >= 0:
                        docs[d].append(token)
    return dict(docs)


def same_document(got: list[int], expected: list[int]) -> bool:
    """Equal, except that a document's first token may be -100: a window's last token is known only
    as its last label, and packing masks the label that crosses into a new document."""
    return len(got) == len(expected) and all(
        g == e or (i == 0 and g == -100) for i, (g, e) in enumerate(zip(got, expected, strict=True))
    )


def test_sigkill_then_same_topology_bit_exact_and_three_ranks_exactly_once(tmp_path: Path) -> None:
    files = write_corpus(tmp_path / "corpus")
    tokenizer = str(default_tokenizer_path())
    eos_id = StreamingHuggingFaceDataset(
        "json", "train", "text", seq_len=SEQ_LEN, tokenizer_path=tokenizer, rank=0, world_size=1, data_files=files
    ).eos_id
    states = tmp_path / "states"
    common = ["--files", *files, "--tokenizer", tokenizer, "--state-dir", str(states), "--seq-len", str(SEQ_LEN)]

    crashed = start_job(
        "stream_job.py", 2,
        *common, "--out", str(tmp_path / "crashed"), "--checkpoint-step", str(CHECKPOINT_STEP),
        "--hang-after-checkpoint",
    )  # fmt: skip
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        past = collections.Counter(r["rank"] for r in records(tmp_path / "crashed") if r["step"] >= CHECKPOINT_STEP)
        if len(list(states.glob("*.json"))) == 2 and min(past[0], past[1]) >= COMPARE_STEPS:
            break
        if crashed.poll() is not None:
            pytest.fail("the job ended before it could be killed: " + crashed.stdout.read().decode()[-4000:])
        time.sleep(0.2)
    else:
        kill_job(crashed)
        pytest.fail("no checkpoint within 180 s")
    kill_job(crashed)
    assert crashed.returncode != 0
    result = tokenloom_cli("stream-state", str(states))  # the saved states are one resumable save
    assert result.exit_code == 0, result.output

    # same topology: the batches after the checkpoint are the killed job's, byte for byte
    stop = CHECKPOINT_STEP + COMPARE_STEPS
    code, output = finish_job(
        start_job(
            "stream_job.py", 2,
            *common, "--out", str(tmp_path / "same"), "--resume", "same", "--start-step", str(CHECKPOINT_STEP),
            "--max-steps", str(stop),
        )
    )  # fmt: skip
    assert code == 0, output[-4000:]
    key = lambda r: (r["rank"], r["step"])  # noqa: E731
    killed = {key(r): r for r in records(tmp_path / "crashed") if CHECKPOINT_STEP <= r["step"] < stop}
    resumed = {key(r): r for r in records(tmp_path / "same")}
    assert len(resumed) == 2 * COMPARE_STEPS
    assert resumed == killed

    # another topology: 3 ranks x 1 worker from the merged states, to the end of the pass
    code, output = finish_job(
        start_job(
            "stream_job.py", 3, *common, "--out", str(tmp_path / "elastic"), "--workers", "1", "--resume", "merge"
        )
    )
    assert code == 0, output[-4000:]
    before = [r for r in records(tmp_path / "crashed") if r["step"] < CHECKPOINT_STEP]
    after = records(tmp_path / "elastic")
    assert {r["world"] for r in after} == {3}
    expected = expected_documents(files, eos_id)
    got = rebuild([before, after])
    assert set(got) == set(expected)
    problems = [d for d in expected if not same_document(got[d], expected[d])]
    assert not problems, f"{len(problems)} documents not emitted exactly once in order, e.g. {problems[:3]}"
