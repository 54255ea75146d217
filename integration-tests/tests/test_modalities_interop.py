"""tokenloom's packed format against the real ``modalities`` package (0.5.0), both ways.

- files written by tokenloom's PackedWriter are read by Modalities' own reader
  (``PackedMemMapDatasetBase`` over ``EmbeddedStreamData``) with the same tokens;
- files written by Modalities' own writers (``PackedDataGenerator.run`` from a
  jsonl file, and ``join_embedded_stream_data``) are read back identically by
  ``open_dataset``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from modalities.dataloader.create_index import IndexGenerator
from modalities.dataloader.create_packed_data import (
    EmbeddedStreamData,
    PackedDataGenerator,
    join_embedded_stream_data,
)
from modalities.dataloader.dataset import PackedMemMapDatasetBase
from modalities.tokenization.tokenizer_wrapper import TokenizerWrapper

from tokenloom.formats import open_dataset, open_writer

DOCS = [[5, 6, 0], [7, 0], [], [8, 9, 10, 11, 0], [199, 0]]
EOD_ID = 0


class ByteTokenizer(TokenizerWrapper):
    """Token id = UTF-8 byte + 1, with id 0 for the end-of-document token (no download needed)."""

    def __init__(self, vocab_size: int) -> None:
        self._vocab_size = vocab_size

    def tokenize(self, text: str) -> list[int]:
        return [byte + 1 for byte in text.encode()]

    def decode(self, input_ids: list[int]) -> str:
        return bytes(i - 1 for i in input_ids).decode()

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def get_token_id(self, token: str) -> int:
        return EOD_ID if token == "<eod>" else ord(token) + 1

    def is_special_token_id(self, token_id: int) -> bool:
        return token_id == EOD_ID


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32"])
def test_modalities_reads_what_tokenloom_writes(tmp_path: Path, dtype: str) -> None:
    path = tmp_path / "data.pbin"
    with open_writer(path, format="packed", dtype=dtype, vocab_size=200, eos_id=EOD_ID) as writer:
        for doc in DOCS:
            writer.add(doc)
    stream = EmbeddedStreamData(path)
    assert stream.token_size_in_bytes == np.dtype(dtype).itemsize
    assert stream.data_len == sum(map(len, DOCS)) * np.dtype(dtype).itemsize
    dataset = PackedMemMapDatasetBase(path, sample_key="input_ids")
    assert len(dataset) == len(DOCS)
    assert [dataset[i]["input_ids"].tolist() for i in range(len(dataset))] == DOCS


@pytest.mark.parametrize(("vocab_size", "token_bytes"), [(200, 1), (300, 2), (70_000, 4)])
def test_tokenloom_reads_what_modalities_packs(tmp_path: Path, vocab_size: int, token_bytes: int) -> None:
    texts = ["hello", "a", "xyz world", "ünïcode"]
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    IndexGenerator(source).create_index(tmp_path / "docs.idx")
    generator = PackedDataGenerator(
        source,
        tokenizer=ByteTokenizer(vocab_size),
        eod_token="<eod>",
        number_of_processes=1,
        jq_pattern=".text",
        processing_batch_size=2,
        raw_samples_queue_size=4,
        processed_samples_queue_size=4,
        index_path=tmp_path / "docs.idx",
    )
    generator.run(tmp_path / "out.pbin")
    ds = open_dataset(tmp_path / "out.pbin")
    expected = [[b + 1 for b in text.encode()] + [EOD_ID] for text in texts]
    assert [ds[i].tolist() for i in range(len(ds))] == expected
    assert ds.dtype.itemsize == token_bytes
    assert ds.metadata["layouts"] == {"out.pbin": "current"}
    reference = PackedMemMapDatasetBase(tmp_path / "out.pbin", sample_key="input_ids")
    assert [reference[i]["input_ids"].tolist() for i in range(len(reference))] == expected


def test_tokenloom_reads_a_file_rewritten_by_modalities_join(tmp_path: Path) -> None:
    ours = tmp_path / "ours.pbin"
    with open_writer(ours, format="packed", dtype="uint16", vocab_size=200) as writer:
        for doc in DOCS:
            writer.add(doc)
    joined = tmp_path / "joined.pbin"
    join_embedded_stream_data([EmbeddedStreamData(ours)], joined)
    ds = open_dataset(joined)
    assert [ds[i].tolist() for i in range(len(ds))] == DOCS
