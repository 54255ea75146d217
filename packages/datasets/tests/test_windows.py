"""MemoryMappedDataset: KempnerForge window semantics, packing, overlap masking, errors, workers."""

import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from tokenloom.datasets import IGNORE_INDEX, MemoryMappedDataset, collate
from tokenloom.formats import ConfigError, ResumeMismatchError

X = IGNORE_INDEX


def stream(n, start=1):
    return list(range(start, start + n))


def test_kempnerforge_windows_do_not_overlap_and_remainder_is_unused(native):
    ds = MemoryMappedDataset(native([stream(11)], eos_id=None), seq_len=3)
    assert len(ds) == 11 // 4
    assert ds[0]["input_ids"].tolist() == [1, 2, 3]
    assert ds[0]["labels"].tolist() == [2, 3, 4]
    assert ds[1]["input_ids"].tolist() == [5, 6, 7]
    assert ds[1]["labels"].tolist() == [6, 7, 8]
    with pytest.raises(IndexError):
        ds[2]


def test_stride_seq_len_makes_every_token_a_label_once(native):
    ds = MemoryMappedDataset(native([stream(10)], eos_id=None), seq_len=3, stride=3)
    assert len(ds) == (10 - 1) // 3
    labels = [t for i in range(len(ds)) for t in ds[i]["labels"].tolist()]
    assert labels == stream(9, start=2)


def test_shards_are_found_by_binary_search_and_remainders_stay_per_shard(native):
    data = native([stream(5, 1), stream(9, 100), stream(4, 200)], eos_id=None, shard_size_tokens=1)
    assert data.num_shards == 3
    ds = MemoryMappedDataset(data, seq_len=2)
    assert ds.samples_per_shard.tolist() == [1, 3, 1]
    firsts = [ds[i]["input_ids"].tolist() for i in range(len(ds))]
    assert firsts == [[1, 2], [100, 101], [103, 104], [106, 107], [200, 201]]


def test_cross_shard_concatenates(native):
    data = native([stream(5, 1), stream(4, 100)], eos_id=None, shard_size_tokens=1)
    ds = MemoryMappedDataset(data, seq_len=2, cross_shard=True)
    assert len(ds) == 3
    assert ds[1]["input_ids"].tolist() == [4, 5]
    assert ds[1]["labels"].tolist() == [5, 100]


def test_packing_through_the_dataset(native):
    ds = MemoryMappedDataset(
        native([[5, 6, 0], [7, 8, 0], [9, 0]]), seq_len=3, pack_sequences=True, position_ids=True, cu_seqlens=True
    )
    s = ds[0]
    assert s["input_ids"].tolist() == [5, 6, 0]
    assert s["labels"].tolist() == [6, 0, X]
    assert s["doc_ids"].tolist() == [0, 0, 0]
    s = ds[1]
    assert s["input_ids"].tolist() == [8, 0, 9]
    assert s["labels"].tolist() == [0, X, 0]
    assert s["doc_ids"].tolist() == [0, 0, 1]
    assert s["position_ids"].tolist() == [0, 1, 0]
    assert s["cu_seqlens"].tolist() == [0, 2, 3, 3]


def test_eos_from_argument_manifest_or_missing(native):
    no_eos = native([[5, 6, 7, 8, 9]], eos_id=None)
    with pytest.raises(ConfigError, match="EOS id"):
        MemoryMappedDataset(no_eos, seq_len=2, pack_sequences=True)
    ds = MemoryMappedDataset(no_eos, seq_len=3, pack_sequences=True, eos_id=7)
    assert ds[0]["labels"].tolist() == [6, 7, X]
    with pytest.raises(ConfigError, match="records"):
        MemoryMappedDataset(native([[1, 0]]), seq_len=1, pack_sequences=True, eos_id=3)


def test_overlap_prefix_labels_are_masked(native):
    # a long document windowed into two entries; the second repeats 2 tokens (3, 4) as context
    data = native([[1, 2, 3, 4], [3, 4, 5, 6, 0]], overlaps=[0, 2], eos_id=0)
    ds = MemoryMappedDataset(data, seq_len=8)
    s = ds[0]
    assert s["input_ids"].tolist() == [1, 2, 3, 4, 3, 4, 5, 6]
    assert s["labels"].tolist() == [2, 3, 4, X, X, 5, 6, 0]
    batch = ds.__getitems__([0])
    assert batch.batched["labels"][0].tolist() == s["labels"].tolist()


def test_overlap_masking_in_a_window_that_starts_inside_the_prefix(native):
    data = native([[1, 2, 3, 4], [3, 4, 5, 6, 0]], overlaps=[0, 2], eos_id=0)
    ds = MemoryMappedDataset(data, seq_len=3, stride=1)
    s = ds[3]  # window [4, 3, 4, 5]
    assert s["input_ids"].tolist() == [4, 3, 4]
    assert s["labels"].tolist() == [X, X, 5]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"seq_len": 0}, "seq_len"), ({"seq_len": 2, "stride": 0}, "stride"), ({"seq_len": 2.5}, "seq_len")],
)
def test_bad_lengths(native, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        MemoryMappedDataset(native([stream(10)], eos_id=None), **kwargs)


def test_shorter_than_one_window_names_the_shard_and_its_length(native):
    data = native([stream(5)], eos_id=None)
    with pytest.raises(ConfigError) as info:
        MemoryMappedDataset(data, seq_len=5)
    message = str(info.value)
    assert "shard_00000" in message and "5 tokens" in message and "6" in message
    assert info.value.path is not None and info.value.path.endswith("shard_00000.bin")


def test_getitems_equals_getitem(native):
    docs = [[*list(np.random.default_rng(i).integers(1, 50, 30)), 0] for i in range(20)]
    ds = MemoryMappedDataset(native(docs, shard_size_tokens=100), seq_len=16, pack_sequences=True, position_ids=True)
    indices = [5, 0, len(ds) - 1, 3, 3]
    batch = ds.__getitems__(indices)
    for row, index in enumerate(indices):
        for key, value in ds[index].items():
            assert torch.equal(batch.batched[key][row], value)
            assert torch.equal(batch[row][key], value)


def test_pickle_copies_no_token_data(native):
    data = native([[t % 999 for t in range(50_000)]], eos_id=None, dtype="uint32")
    ds = MemoryMappedDataset(data, seq_len=64)
    ds[0]  # map the tokens in this process
    blob = pickle.dumps(ds)
    assert len(blob) < 5_000  # 200 kB of tokens stay on disk
    clone = pickle.loads(blob)
    assert torch.equal(clone[7]["input_ids"], ds[7]["input_ids"])


def test_file_pattern_selects_shards(native):
    data = native([stream(6, 1), stream(6, 100)], eos_id=None, shard_size_tokens=1)
    ds = MemoryMappedDataset(data, seq_len=2, file_pattern="shard_00001.*")
    assert ds[0]["input_ids"].tolist() == [100, 101]
    with pytest.raises(ConfigError, match="matches none"):
        MemoryMappedDataset(data, seq_len=2, file_pattern="nope*")


def test_state_dict_guards_the_configuration(native):
    data = native([stream(40)], eos_id=None)
    a = MemoryMappedDataset(data, seq_len=4)
    a.load_state_dict(a.state_dict())
    with pytest.raises(ResumeMismatchError):
        MemoryMappedDataset(data, seq_len=5).load_state_dict(a.state_dict())


@pytest.mark.parametrize("use_collate", [True, False])
def test_dataloader_with_two_workers_matches_direct_reads(native, use_collate):
    docs = [[*list(range(1, 40)), 0] for _ in range(30)]
    ds = MemoryMappedDataset(native(docs), seq_len=31, pack_sequences=True)
    loader = (
        DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate)
        if use_collate
        else DataLoader(ds, batch_size=4, num_workers=2)
    )
    rows = [row for batch in loader for row in batch["labels"]]
    assert len(rows) == len(ds)
    for i, row in enumerate(rows):
        assert torch.equal(row, ds[i]["labels"])


def test_pickled_size_does_not_grow_with_the_number_of_entries(native, tmp_path):
    from tokenloom.datasets import PackedDocumentDataset

    sizes = {}
    for entries in (10, 20_000):
        tokens = np.arange(1, 40_001) % 997 + 1
        docs = np.split(tokens, np.linspace(0, len(tokens), entries + 1, dtype=np.int64)[1:-1])
        path = native(docs, eos_id=None).root
        windows = MemoryMappedDataset(path, seq_len=64)
        packed = PackedDocumentDataset(path, 4096, plan_cache_dir=tmp_path / "c", pad_id=0)
        sizes[entries] = (len(pickle.dumps(windows)), len(pickle.dumps(packed)))
        clone = pickle.loads(pickle.dumps(windows))
        assert len(clone.dataset) == entries  # the entry index is reopened where it is asked for
        assert torch.equal(clone[3]["labels"], windows[3]["labels"])
        packed_clone = pickle.loads(pickle.dumps(packed))
        assert torch.equal(packed_clone[1]["input_ids"], packed[1]["input_ids"])
    # 20,000 entries carry 180 kB of offsets and overlap lengths; none of it may travel
    assert abs(sizes[20_000][0] - sizes[10][0]) < 200
    assert abs(sizes[20_000][1] - sizes[10][1]) < 200


def test_gpt_simple_through_the_dataset(native):
    # EOS = 0; windows of 4 + 1 tokens: [5, 6, 0, 7, 8] and [0, 9, 0, 4, 3]
    ds = MemoryMappedDataset(native([[5, 6, 0], [7, 8, 0], [9, 0], [4, 3]]), seq_len=4, pack_sequences="gpt-simple")
    s = ds[0]
    assert s["input_ids"].tolist() == [5, 6, 0, 7]
    assert s["labels"].tolist() == [6, 0, X, 8]  # the token after the EOD is never a target
    assert s["position_ids"].tolist() == [0, 1, 2, 3]  # continuous, not reset
    s = ds[1]
    assert s["input_ids"].tolist() == [0, 9, 0, 4]
    assert s["labels"].tolist() == [X, 0, X, 3]
    assert s["position_ids"].tolist() == [0, 1, 2, 3]
    assert s["doc_ids"].tolist() == [0, 1, 1, 2]
    batch = ds.__getitems__([1, 0]).batched
    assert batch["labels"].tolist() == [[X, 0, X, 3], [6, 0, X, 8]]
