"""PackedDocumentDataset: hand-computed packed sequences, splitting, overlap, cache."""

import os

import numpy as np
import pytest
from torch.utils.data import DataLoader

import tokenloom.datasets._packing_plan as packed_module
from tokenloom.datasets import IGNORE_INDEX, PackedDocumentDataset, collate
from tokenloom.formats import ConfigError

X = IGNORE_INDEX


def test_best_fit_packs_whole_documents_with_padding(native, tmp_path):
    # lengths 4, 3, 2, 1 into max_length 5: best fit -> [4, 1], [3, 2]
    data = native([[1, 2, 3, 0], [4, 5, 0], [6, 0], [0]], eos_id=0)
    ds = PackedDocumentDataset(data, 5, plan_cache_dir=tmp_path / "c", pad_id=9, cu_seqlens=True)
    assert len(ds) == 2
    assert ds.padding_fraction == 0.0
    a = ds[0]
    assert a["input_ids"].tolist() == [1, 2, 3, 0, 0]
    assert a["labels"].tolist() == [2, 3, 0, X, X]
    assert a["doc_ids"].tolist() == [0, 0, 0, 0, 1]
    assert a["position_ids"].tolist() == [0, 1, 2, 3, 0]
    assert a["cu_seqlens"].tolist() == [0, 4, 5, 5, 5, 5]
    b = ds[1]
    assert b["input_ids"].tolist() == [4, 5, 0, 6, 0]
    assert b["labels"].tolist() == [5, 0, X, 0, X]


def test_padding_has_ignored_labels_and_is_reported(native, tmp_path):
    data = native([[1, 2, 0], [3, 0]], eos_id=0)
    ds = PackedDocumentDataset(data, 4, plan_cache_dir=tmp_path / "c", pad_id=7)
    assert len(ds) == 2
    assert ds[0]["input_ids"].tolist() == [1, 2, 0, 7]
    assert ds[0]["labels"].tolist() == [2, 0, X, X]
    assert ds[1]["input_ids"].tolist() == [3, 0, 7, 7]
    assert ds[1]["labels"].tolist() == [0, X, X, X]
    assert ds.padding_fraction == pytest.approx(3 / 8)


def test_long_entries_are_split_and_overlap_prefixes_masked(native, tmp_path):
    data = native([[1, 2, 3, 4, 5, 6, 0], [5, 6, 7, 0]], overlaps=[0, 2], eos_id=0)
    ds = PackedDocumentDataset(data, 4, plan_cache_dir=tmp_path / "c", pad_id=9)
    rows = {tuple(ds[i]["input_ids"].tolist()): ds[i]["labels"].tolist() for i in range(len(ds))}
    assert rows[(1, 2, 3, 4)] == [2, 3, 4, X]
    assert rows[(5, 6, 7, 0)] == [X, 7, 0, X]  # 6 is a repeated (overlap) token: never a label
    assert rows[(5, 6, 0, 9)] == [6, 0, X, X]


def test_plan_is_cached_and_reused(native, tmp_path, monkeypatch):
    data = native([[1, 0], [2, 3, 0], [4, 0]], eos_id=0)
    first = PackedDocumentDataset(data, 4, plan_cache_dir=tmp_path / "c")
    entries = os.listdir(tmp_path / "c")
    assert len(entries) == 1 and entries[0].startswith("packplan-")

    def fail(*args, **kwargs):
        raise AssertionError("the plan should come from the cache")

    monkeypatch.setattr(packed_module, "compute_plan", fail)
    again = PackedDocumentDataset(data, 4, plan_cache_dir=tmp_path / "c")
    assert [again[i]["input_ids"].tolist() for i in range(len(again))] == [
        first[i]["input_ids"].tolist() for i in range(len(first))
    ]
    with pytest.raises(AssertionError, match="cache"):
        PackedDocumentDataset(data, 5, plan_cache_dir=tmp_path / "c")  # other settings: another key


def test_greedy_algorithm_and_errors(native, tmp_path):
    data = native([[1, 0], [2, 3, 0], [4, 0]], eos_id=0)
    ds = PackedDocumentDataset(data, 4, algorithm="greedy", plan_cache_dir=tmp_path / "c")
    tokens = sorted(t for i in range(len(ds)) for t in ds[i]["input_ids"].tolist() if t != 0)
    assert tokens == [1, 2, 3, 4]
    with pytest.raises(ConfigError, match="algorithm"):
        PackedDocumentDataset(data, 4, algorithm="worst-fit", plan_cache_dir=tmp_path / "c")
    with pytest.raises(ConfigError, match="seq_len"):
        PackedDocumentDataset(data, 0, plan_cache_dir=tmp_path / "c")


def test_every_token_appears_once_through_two_workers(native, tmp_path):
    rng = np.random.default_rng(3)
    docs = [[*list(rng.integers(1, 900, rng.integers(1, 60))), 0] for _ in range(200)]
    ds = PackedDocumentDataset(native(docs, eos_id=0), 64, plan_cache_dir=tmp_path / "c", pad_id=999)
    loader = DataLoader(ds, batch_size=8, num_workers=2, collate_fn=collate)
    seen = np.concatenate([batch["input_ids"].flatten().numpy() for batch in loader])
    expected = np.concatenate([np.asarray(d) for d in docs])
    assert np.array_equal(np.sort(seen[seen != 999]), np.sort(expected))


def test_plan_cache_key_follows_the_data_not_only_the_settings(native, tmp_path):
    a = PackedDocumentDataset(native([[1, 0], [2, 3, 0]], eos_id=0), 4, plan_cache_dir=tmp_path / "c")
    b = PackedDocumentDataset(native([[1, 2, 3, 0], [4, 0]], eos_id=0), 4, plan_cache_dir=tmp_path / "c")
    assert a.plan_dir != b.plan_dir
    assert sorted(p.name.startswith("packplan-") for p in (tmp_path / "c").iterdir()) == [True, True]


def test_a_plan_published_meanwhile_by_another_rank_is_used_and_no_scratch_is_left(native, tmp_path, monkeypatch):
    data = native([[1, 0], [2, 3, 0], [4, 0]], eos_id=0)
    real_compute = packed_module.compute_plan
    other_rank = {}

    def racing_compute(*args, **kwargs):
        # while this rank computes, another one publishes the same plan under the same key
        if not other_rank:
            other_rank["started"] = True
            other_rank["ds"] = PackedDocumentDataset(data, 4, plan_cache_dir=tmp_path / "c")
        return real_compute(*args, **kwargs)

    monkeypatch.setattr(packed_module, "compute_plan", racing_compute)
    ds = PackedDocumentDataset(data, 4, plan_cache_dir=tmp_path / "c")
    assert ds.plan_dir == other_rank["ds"].plan_dir
    assert [p.name for p in (tmp_path / "c").iterdir()] == [ds.plan_dir.name]
    assert [ds[i]["input_ids"].tolist() for i in range(len(ds))] == [
        other_rank["ds"][i]["input_ids"].tolist() for i in range(len(ds))
    ]


def test_an_unfinished_plan_directory_is_rebuilt(native, tmp_path):
    data = native([[1, 0], [2, 3, 0]], eos_id=0)
    first = PackedDocumentDataset(data, 4, plan_cache_dir=tmp_path / "c")
    (first.plan_dir / "plan.json").unlink()  # a plan without its last file is not a plan
    for path in first.plan_dir.iterdir():
        path.unlink()
    first.plan_dir.rmdir()
    (tmp_path / "c" / f".{first.plan_dir.name}-crashed").mkdir()  # a writer's leftover scratch
    again = PackedDocumentDataset(data, 4, plan_cache_dir=tmp_path / "c")
    assert (again.plan_dir / "plan.json").exists()
    assert len(again) == len(first)


@pytest.mark.parametrize("name", ["plan.json", "length.npy"])
def test_a_fifo_in_the_plan_cache_is_damage_not_a_hang(native, tmp_path, name):
    import threading

    data = native([[1, 0], [2, 3, 0], [4, 0]], eos_id=0)
    first = PackedDocumentDataset(data, 4, plan_cache_dir=tmp_path / "c")
    expected = [first[i]["input_ids"].tolist() for i in range(len(first))]
    fifo = first.plan_dir / name
    fifo.unlink()
    os.mkfifo(fifo)
    result: list = []
    worker = threading.Thread(
        target=lambda: result.append(PackedDocumentDataset(data, 4, plan_cache_dir=tmp_path / "c"))
    )
    worker.start()
    worker.join(20)
    hung = worker.is_alive()
    if hung:  # today's code: open() blocks on the FIFO; unblock it so the test ends
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(20)
    assert not hung, f"opening the plan cache blocked on a FIFO at {name}"
    again = result[0]
    assert [again[i]["input_ids"].tolist() for i in range(len(again))] == expected
    assert (again.plan_dir / name).is_file()  # the damaged plan was moved aside and rebuilt
