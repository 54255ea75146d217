"""SampleBatch / collate: one storage per batch, default_collate keeps it, rows stay correct."""

import pickle
from typing import cast

import numpy as np
import torch
from torch.utils.data import DataLoader, default_collate

from tokenloom.datasets import MemoryMappedDataset, PackedDocumentDataset, SampleBatch, collate


def storages(batch):
    return {value.untyped_storage().data_ptr() for value in batch.values()}


def test_getitems_puts_every_key_in_one_storage(native, tmp_path):
    data = native([[1, 2, 3, 0], [4, 5, 0], [6, 7, 8, 9, 0]] * 4, eos_id=0)
    plain = MemoryMappedDataset(data, seq_len=4).__getitems__([0, 2, 1])
    packed = MemoryMappedDataset(data, seq_len=4, pack_sequences=True, position_ids=True, cu_seqlens=True)
    documents = PackedDocumentDataset(data, 6, cache_dir=tmp_path / "c", cu_seqlens=True)
    for batch in (plain, packed.__getitems__([1, 0]), documents.__getitems__([0, 1])):
        assert len(storages(batch.batched)) == 1
        for value in batch.batched.values():
            assert value.is_contiguous()
    assert packed.__getitems__([1, 0]).batched["cu_seqlens"].dtype == torch.int32


def test_default_collate_returns_the_batched_tensors_without_stacking(native):
    ds = MemoryMappedDataset(native([list(range(1, 40))], eos_id=None), seq_len=4)
    batch = ds.__getitems__([3, 1])
    collated = default_collate(cast(list, batch))  # what DataLoader passes
    assert collated.keys() == batch.batched.keys()
    assert all(collated[key] is batch.batched[key] for key in collated)
    assert collate(batch) is batch.batched


def test_rows_gathered_from_two_batches_are_stacked(native):
    ds = MemoryMappedDataset(native([list(range(1, 40))], eos_id=None), seq_len=4)
    rows = [ds.__getitems__([0, 1])[1], ds.__getitems__([2])[0]]
    for collated in (default_collate(rows), collate(rows)):
        assert collated["input_ids"].tolist() == [[6, 7, 8, 9], [11, 12, 13, 14]]
        assert collated["labels"].tolist() == [[7, 8, 9, 10], [12, 13, 14, 15]]


def test_sample_batch_is_a_sequence_of_rows_and_pickles():
    batched = {"input_ids": torch.arange(6).view(2, 3), "labels": torch.arange(6, 12).view(2, 3)}
    batch = SampleBatch(batched)
    assert len(batch) == 2
    assert [row["labels"].tolist() for row in batch] == [[6, 7, 8], [9, 10, 11]]
    assert batch[-1]["input_ids"].tolist() == [3, 4, 5]
    assert [row["input_ids"].tolist() for row in batch[1:]] == [[3, 4, 5]]
    clone = pickle.loads(pickle.dumps(batch))
    assert torch.equal(clone.batched["labels"], batched["labels"])
    row = pickle.loads(pickle.dumps(batch[0]))
    assert type(row) is dict and row["input_ids"].tolist() == [0, 1, 2]


def test_workers_send_one_storage_per_batch_through_both_collates(native):
    docs = [list(np.arange(1, 60) % 50 + 1) for _ in range(10)]
    ds = MemoryMappedDataset(native(docs, eos_id=None), seq_len=15)
    for collate_fn in (None, collate):
        loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate_fn)
        batches = list(loader)
        assert all(len(storages(b)) == 1 for b in batches)
        got = torch.cat([b["input_ids"] for b in batches])
        assert torch.equal(got, torch.stack([ds[i]["input_ids"] for i in range(len(ds))]))
