"""A new corpus kind is one module and its registration line: a toy kind (xz-compressed jsonl), registered in
the test, is read by tokenize and by hf-streaming exactly as its plain jsonl is."""

from __future__ import annotations

import json
import lzma
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tokenloom.hf_streaming import StreamingHuggingFaceDataset
from tokenloom.tokenize import TokenizeConfig, tokenize
from tokenloom.tokenize.inputs import InputReader, register, sniff, unregister


class XzJsonl(InputReader):
    """The whole module a new kind costs (here inside the test)."""

    name = "xz-compressed jsonl"
    suffixes = (".jsonl.xz",)
    magic = (b"\xfd7zXZ\x00",)
    stream_name = "xz"
    stream_errors = (lzma.LZMAError,)

    def open(self, source: Any, **options: Any) -> Any:
        return lzma.LZMAFile(source)


@pytest.fixture
def xz_registered() -> Iterator[InputReader]:
    yield register(XzJsonl())
    unregister(XzJsonl.name)  # the registration ends with the test


def _corpus(root: Path, compress: bool) -> Path:
    root.mkdir()
    lines = "".join(json.dumps({"text": f"document {i} " + "word " * (i % 17)}) + "\n" for i in range(300))
    if compress:
        (root / "a.jsonl.xz").write_bytes(lzma.compress(lines.encode()))
    else:
        (root / "a.jsonl").write_text(lines)
    return root


def _shard_bytes(out: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted(out.rglob("*")) if p.suffix in (".bin", ".idx")]


@pytest.mark.parametrize("num_nodes", [None, 1])
def test_tokenize_reads_a_registered_kind_as_its_plain_jsonl(tmp_path, tokenizer_dir, xz_registered, num_nodes):
    plain, toy = _corpus(tmp_path / "plain", False), _corpus(tmp_path / "toy", True)
    assert sniff(toy / "a.jsonl.xz") is xz_registered
    outputs = []
    for name, source in (("plain", plain), ("toy", toy)):
        out = tmp_path / f"out-{name}"
        config = TokenizeConfig(
            input_dir=source, output_dir=out, tokenizer=str(tokenizer_dir), num_workers=1, num_nodes=num_nodes
        )
        summary = tokenize(config)
        assert summary.documents == 300
        outputs.append(_shard_bytes(out))
    assert outputs[0] == outputs[1] and outputs[0]


def test_a_cut_stream_of_a_registered_kind_is_named_by_its_compression(tmp_path, tokenizer_dir, xz_registered):
    from tokenloom.formats import RecordError

    toy = _corpus(tmp_path / "toy", True)
    data = (toy / "a.jsonl.xz").read_bytes()
    (toy / "a.jsonl.xz").write_bytes(data[: len(data) // 2])
    config = TokenizeConfig(input_dir=toy, output_dir=tmp_path / "out", tokenizer=str(tokenizer_dir), num_workers=1)
    with pytest.raises(RecordError, match="the xz stream is truncated or corrupt"):
        tokenize(config)


def test_hf_streaming_reads_a_registered_kind_as_its_plain_jsonl(tmp_path, tokenizer_dir, xz_registered):
    plain, toy = _corpus(tmp_path / "plain", False), _corpus(tmp_path / "toy", True)

    def samples(path: Path) -> list[list[int]]:
        ds = StreamingHuggingFaceDataset("json", "train", "text", 16, str(tokenizer_dir), data_files=[str(path)])
        return [s["input_ids"].tolist() for s in ds]

    expected = samples(plain / "a.jsonl")
    assert samples(toy / "a.jsonl.xz") == expected and len(expected) > 10
