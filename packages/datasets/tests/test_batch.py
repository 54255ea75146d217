"""SampleBatch / collate: one storage per batch, compact windows from workers, rows correct."""

import pickle
from typing import cast

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from tokenloom.datasets import MemoryMappedDataset, PackedDocumentDataset, SampleBatch, collate


def storages(batch):
    return {value.untyped_storage().data_ptr() for value in batch.values()}


def test_getitems_puts_every_key_in_one_storage(native, tmp_path):
    data = native([[1, 2, 3, 0], [4, 5, 0], [6, 7, 8, 9, 0]] * 4, eos_id=0)
    plain = MemoryMappedDataset(data, seq_len=4).__getitems__([0, 2, 1])
    packed = MemoryMappedDataset(data, seq_len=4, pack_sequences=True, position_ids=True, cu_seqlens=True)
    documents = PackedDocumentDataset(data, 6, plan_cache_dir=tmp_path / "c", cu_seqlens=True)
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


def _edit_labels_in_worker(batch):
    out = collate(batch)
    out["labels"][:, 0] = -100  # in place, after collation, inside the worker
    return out


def _add_key_in_worker(batch):
    out = collate(batch)
    out["attention_mask"] = torch.ones_like(out["input_ids"])
    return out


@pytest.mark.parametrize("dtype", ["uint16", "int32", "uint32"])
def test_plain_batches_cross_as_storage_dtype_windows_and_arrive_as_int64(native, dtype):
    docs = [list(np.arange(1, 60) % 50 + 1) for _ in range(10)]
    ds = MemoryMappedDataset(native(docs, eos_id=None, dtype=dtype), seq_len=15)
    batch = ds.__getitems__([3, 0, 5])
    assert batch.windows is not None and batch.windows.dtype == np.dtype(dtype)
    assert len(pickle.dumps(batch)) < batch.windows.nbytes + 300  # the compact windows, not the int64 tensors
    clone = pickle.loads(pickle.dumps(batch))
    for key in ("input_ids", "labels"):
        assert torch.equal(clone.batched[key], batch.batched[key])
    expected = torch.stack([ds[i]["input_ids"] for i in range(len(ds))])
    expected_labels = torch.stack([ds[i]["labels"] for i in range(len(ds))])
    for collate_fn in (None, collate):
        batches = list(DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate_fn))
        for b in batches:
            assert type(b) is dict and set(b) == {"input_ids", "labels"}
            assert all(v.dtype == torch.int64 and v.is_contiguous() for v in b.values())
        assert torch.equal(torch.cat([b["input_ids"] for b in batches]), expected)
        assert torch.equal(torch.cat([b["labels"] for b in batches]), expected_labels)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_editing_labels_in_place_leaves_input_ids_alone(native, num_workers):
    ds = MemoryMappedDataset(native([list(range(1, 60))], eos_id=None), seq_len=4)
    for collate_fn in (None, collate):
        loader = DataLoader(ds, batch_size=3, num_workers=num_workers, collate_fn=collate_fn)
        for b in loader:
            before = b["input_ids"].clone()
            b["labels"].fill_(-100)
            b["labels"][:, 1:] = 7
            assert torch.equal(b["input_ids"], before)
    row = ds.__getitems__([0, 1])[0]
    before = row["input_ids"].clone()
    row["labels"].fill_(-100)
    assert torch.equal(row["input_ids"], before)


def test_a_batch_changed_in_the_worker_arrives_changed(native):
    ds = MemoryMappedDataset(native([list(range(1, 60))], eos_id=None), seq_len=4)
    edited = list(DataLoader(ds, batch_size=3, num_workers=1, collate_fn=_edit_labels_in_worker))
    assert all((b["labels"][:, 0] == -100).all() and (b["labels"][:, 1:] != -100).all() for b in edited)
    added = list(DataLoader(ds, batch_size=3, num_workers=1, collate_fn=_add_key_in_worker))
    assert all(set(b) == {"input_ids", "labels", "attention_mask"} for b in added)
    assert torch.equal(added[0]["input_ids"], ds.__getitems__([0, 1, 2]).batched["input_ids"])
