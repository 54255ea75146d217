"""`tokenize --train-type sft` output is a training set as it is: DatasetFactory's sft windows and packed SFT."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import torch

from tokenloom.datasets import DatasetFactory, PackedSFTDataset
from tokenloom.formats import open_records
from tokenloom.tokenize.chat import default_chat_template


def test_sft_store_opens_as_windows_and_packed(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    records = [
        {
            "messages": [
                {"role": "user", "content": f"What does math.{name} do?"},
                {"role": "assistant", "content": f"math.{name} is a function of the math module, number {i}."},
            ]
        }
        for i, name in enumerate(["sqrt", "floor", "ceil", "fabs", "gcd"] * 4)
    ]
    (tmp_path / "in" / "c.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    out = tmp_path / "out"
    argv = ["--input-dir", str(tmp_path / "in"), "--output-dir", str(out), "--train-type", "sft"]
    argv += ["--chat-template", str(default_chat_template()), "--num-workers", "0", "--no-progress"]
    result = subprocess.run([sys.executable, "-m", "tokenloom.formats", "tokenize", *argv], capture_output=True)
    assert result.returncode == 0, result.stderr
    store = open_records(out)
    assert len(store) == len(records)
    windows = DatasetFactory.load("sft", str(out), 32)
    sample = windows[0]
    assert {"input_ids", "loss_mask"} <= set(sample) and len(sample["input_ids"]) == 32
    packed = PackedSFTDataset(out, 128)
    assert len(packed) < len(records)  # several conversations per 128-token sample
    labels = packed[0]["labels"]
    assert isinstance(labels, torch.Tensor) and (labels == -100).any() and (labels != -100).any()
