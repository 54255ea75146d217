"""Rebuild every document from logged windows and compare with the tokenizer's own output."""

from __future__ import annotations

import collections
import gzip
import json
from pathlib import Path

import pyarrow.parquet as pq
from tokenizers import Tokenizer

SHIFT = 40


def expected_documents(files: list[str], tokenizer_dir: Path, eos_id: int) -> dict[int, list[int]]:
    """doc_id -> encode(text) + [EOS], with the doc ids the stream assigns (file << 40 | offset or row)."""
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    texts: dict[int, str] = {}
    for index, path in enumerate(files):
        if path.endswith(".parquet"):
            for row, text in enumerate(pq.read_table(path).column("text").to_pylist()):
                texts[index << SHIFT | row] = text
            continue
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            offset = 0
            for line in f:
                if line.strip():
                    texts[index << SHIFT | offset] = json.loads(line)["text"]
                offset += len(line)
    ids = tokenizer.encode_batch(list(texts.values()), add_special_tokens=False)
    return {key: [*enc.ids, eos_id] for key, enc in zip(texts, ids, strict=True)}


def windows_of(record: dict) -> list[tuple[list[int], list[int]]]:
    """(tokens, doc ids) of each window in a logged batch; label column restores the last token."""
    out = []
    for inputs, labels, docs, label_docs in zip(
        record["input_ids"], record["labels"], record["doc_index"], record["label_doc_index"], strict=True
    ):
        out.append(([*inputs, labels[-1]], [*docs, label_docs[-1]]))
    return out


def read_log(path: Path, *, up_to_step: int | None = None) -> list[dict]:
    records = []
    if not path.exists():
        return records
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if up_to_step is None or record["step"] <= up_to_step:
            records.append(record)
    return records


def rebuild(segments: list[list[dict]]) -> dict[int, list[int]]:
    """doc id -> tokens in emission order: segments in order, in each segment per rank in step order."""
    docs: dict[int, list[int]] = collections.defaultdict(list)
    for records in segments:
        for record in sorted(records, key=lambda r: (r["rank"], r["step"])):
            for tokens, ids in windows_of(record):
                for token, doc in zip(tokens, ids, strict=True):
                    if doc >= 0:
                        docs[doc].append(token)
    return dict(docs)


def compare(expected: dict[int, list[int]], got: dict[int, list[int]]) -> list[str]:
    problems = []
    for key in sorted(set(expected) | set(got)):
        want, have = expected.get(key), got.get(key)
        if want is None:
            problems.append(f"doc {key} emitted but not in the data")
        elif have is None:
            problems.append(f"doc {key} never emitted")
        elif have != want:
            problems.append(f"doc {key}: {len(have)} tokens emitted, {len(want)} expected (or out of order)")
    return problems
