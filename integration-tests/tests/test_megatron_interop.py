"""Megatron interop against the real peer: megatron-core's IndexedDatasetBuilder and IndexedDataset."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from tokenloom.formats import convert_dataset, open_dataset, open_writer

torch = pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # megatron-core warns that Apex / Transformer Engine are absent
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

RNG = np.random.default_rng(7)
DOCS = [RNG.integers(0, 50_000, size=int(n)).tolist() for n in RNG.integers(0, 300, size=60)] + [[], [1]]


def entries(ds) -> list[list[int]]:
    return [ds[i].tolist() for i in range(len(ds))]


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64, np.uint8])
def test_files_built_by_megatron_core_read_back_identical(tmp_path: Path, dtype) -> None:
    docs = [[t % 256 for t in doc] for doc in DOCS] if dtype is np.uint8 else DOCS
    prefix = str(tmp_path / "peer_text_document")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for doc in docs:
        builder.add_item(torch.tensor(doc, dtype=torch.int64))
        builder.end_document()
    builder.finalize(prefix + ".idx")

    ds = open_dataset(prefix, validate="deep")
    assert ds.format == "megatron"
    assert ds.dtype == np.dtype(dtype)
    assert entries(ds) == docs
    peer = IndexedDataset(prefix)
    assert ds.doc_lengths.tolist() == peer.sequence_lengths.tolist()
    assert ds.metadata["document_indices"][0].tolist() == peer.document_indices.tolist()


def test_multi_sequence_documents_from_megatron_core(tmp_path: Path) -> None:
    prefix = str(tmp_path / "sentences")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
    builder.add_document(torch.tensor([1, 2, 3, 4, 5]), [2, 3])
    builder.add_document(torch.tensor([6]), [1])
    builder.add_document(torch.tensor([7, 8, 9]), [1, 1, 1])
    builder.finalize(prefix + ".idx")
    ds = open_dataset(prefix)
    assert entries(ds) == [[1, 2], [3, 4, 5], [6], [7], [8], [9]]
    assert ds.metadata["document_indices"][0].tolist() == [0, 2, 3, 6]


def test_multimodal_index_from_megatron_core(tmp_path: Path) -> None:
    prefix = str(tmp_path / "mm")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16, multimodal=True)
    builder.add_item(torch.tensor([1, 2]), mode=0)
    builder.add_item(torch.tensor([3]), mode=1)
    builder.end_document()
    builder.finalize(prefix + ".idx")
    ds = open_dataset(prefix)
    assert entries(ds) == [[1, 2], [3]]
    assert ds.metadata["multimodal"] is True


@pytest.mark.parametrize("dtype", ["uint16", "int32", "int64", "uint8"])
def test_tokenloom_writer_output_reads_identically_in_megatron_core(tmp_path: Path, dtype: str) -> None:
    docs = [[t % 256 for t in doc] for doc in DOCS] if dtype == "uint8" else DOCS
    prefix = tmp_path / "ours_text_document"
    with open_writer(prefix, format="megatron", dtype=dtype) as writer:
        for doc in docs:
            writer.add(doc)
    peer = IndexedDataset(str(prefix))
    assert len(peer) == len(docs)
    assert peer.index.dtype == np.dtype(dtype).type
    assert [peer[i].tolist() for i in range(len(peer))] == docs
    assert peer.sequence_lengths.tolist() == [len(d) for d in docs]
    assert peer.document_indices.tolist() == list(range(len(docs) + 1))
    # a range inside one sequence, as GPTDataset asks for it
    assert peer.get(3, offset=2, length=5).tolist() == docs[3][2:7]


def test_converted_native_data_reads_in_megatron_core(tmp_path: Path) -> None:
    with open_writer(tmp_path / "native", format="native", dtype="uint16", eos_id=0, shard_size_tokens=1000) as writer:
        for doc in DOCS:
            writer.add([*[t + 1 for t in doc], 0])
    result = convert_dataset(tmp_path / "native", tmp_path / "m" / "train", to="megatron", chunk_tokens=1000)
    assert result.entries == len(DOCS)
    peer = IndexedDataset(str(tmp_path / "m" / "train"))
    source = open_dataset(tmp_path / "native")
    assert [peer[i].tolist() for i in range(len(peer))] == entries(source)
