# pyright: reportMissingImports=false
# (gpt_simple lives only in the isolated environment test_gpt_simple_interop.py builds)
"""Runs inside an isolated gpt-simple-lm environment: ``python gpt_simple_driver.py JOBS_JSON``.

JOBS_JSON is a list of jobs, run in order in this one process (importing torch
once); stdout gets the JSON list of their results:

    {"op": "pretokenize", "argv": [...]}
        GPT-Simple's own pretokenize command line (``gpt_simple.pretokenize.main``)
    {"op": "entries", "dir": DIR}
        every [tokens, overlap] of DIR's shards as GPT-Simple's own code reads them:
        read_idx for the index, the dtype PreTokenizedDataset picks for the data
    {"op": "samples", "dir": DIR, "max_length": L, "pack": bool, "eod": E, "pad": P}
        every item PreTokenizedDataset(sorted DIR/*.bin) yields, trimmed to its
        attention mask: input_ids, labels, position_ids
    {"op": "finalize", "sequences": [[tokens, ...], ...], "max_length": L, "eod": E, "pad": P}
        PreTokenizedDataset._finalize_sequence (attention_mode "document", so with
        doc_ids) on each list of documents, trimmed to its attention mask
    {"op": "inspect", "dir": DIR}
        GPT-Simple's validate-time bucket inventory (shards, tokens, docs)
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import numpy as np
from gpt_simple import pretokenize
from gpt_simple.data import PreTokenizedDataset
from gpt_simple.pretokenize import read_idx
from gpt_simple.validate import _inspect_bucket


def entries(directory: Path) -> dict:
    out = []
    dtypes = []
    for bin_path in sorted(directory.glob("*.bin")):
        code, offsets, overlaps = read_idx(bin_path.with_suffix(".idx"))
        dtypes.append(int(code))
        tokens = np.fromfile(bin_path, dtype=np.uint16 if code == 2 else np.uint32)
        for i in range(len(overlaps)):
            out.append([tokens[offsets[i] : offsets[i + 1]].tolist(), int(overlaps[i])])
    return {"dtype_codes": dtypes, "entries": out}


def samples(directory: Path, max_length: int, pack: bool, eod: int, pad: int) -> list[dict]:
    dataset = PreTokenizedDataset(
        sorted(directory.glob("*.bin")),
        max_length=max_length,
        seed=1234,
        pad_token_id=pad,
        eod_token_id=eod,
        pack_sequences=pack,
    )
    items = []
    for item in dataset:
        n = int(item["attention_mask"].sum())
        items.append(
            {
                "input_ids": item["input_ids"][:n].tolist(),
                "labels": item["labels"][:n].tolist(),
                "position_ids": item["position_ids"][:n].tolist(),
            }
        )
    return items


def run(job: dict) -> object:
    if job["op"] == "finalize":
        builder = PreTokenizedDataset(
            [],
            max_length=job["max_length"],
            seed=0,
            pad_token_id=job["pad"],
            eod_token_id=job["eod"],
            attention_mode="doc",
        )
        out = []
        for docs in job["sequences"]:
            item = builder._finalize_sequence([np.asarray(d, dtype=np.int64) for d in docs], [0] * len(docs))
            n = int(item["attention_mask"].sum())
            out.append({key: item[key][:n].tolist() for key in ("input_ids", "labels", "position_ids", "doc_ids")})
        return out
    if job["op"] == "pretokenize":
        sys.argv = ["pretokenize", *job["argv"]]
        with contextlib.redirect_stdout(sys.stderr):
            pretokenize.main()
        return None
    directory = Path(job["dir"])
    if job["op"] == "entries":
        return entries(directory)
    if job["op"] == "samples":
        return samples(directory, job["max_length"], job["pack"], job["eod"], job["pad"])
    if job["op"] == "inspect":
        info = _inspect_bucket(directory)
        return {"shards": info.shards, "tokens": info.tokens, "docs": info.docs}
    raise SystemExit(f"unknown op {job['op']!r}")


def main() -> None:
    results = [run(job) for job in json.loads(sys.argv[1])]
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
