"""Review attacks on PackedSFTDataset: elastic resume by record id, exact cu_seqlens and boundary labels."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tokenloom.datasets import IGNORE_INDEX, PackedSFTDataset
from tokenloom.formats import RecordStoreWriter
from tokenloom.sampler import ResumableDistributedSampler


def write_store(path: Path, lengths: list[int]) -> tuple[Path, list[tuple[np.ndarray, np.ndarray]]]:
    convs = []
    with RecordStoreWriter(path, train_type="sft", dtype="uint16", key_dtypes={"loss_mask": "bool"}) as writer:
        for i, n in enumerate(lengths):
            tokens = (np.arange(n) + 7 * i) % 400 + 1
            mask = np.zeros(n, dtype=np.uint8)
            mask[n // 2 :] = 1
            mask[-1] = 1
            writer.add_record({"sequence": tokens, "loss_mask": mask, "position_ids": np.arange(n)})
            convs.append((tokens, mask))
    return path, convs


def test_resume_on_another_world_size_consumes_every_record_once(tmp_path: Path) -> None:
    lengths = [int(n) for n in np.random.default_rng(5).integers(2, 30, 90)]
    store, _ = write_store(tmp_path / "sft", lengths)
    ds = PackedSFTDataset(store, 32)
    consumed: list[int] = []
    ranks = [ResumableDistributedSampler(ds, num_replicas=2, rank=r, seed=3, pad=False) for r in range(2)]
    for sampler in ranks:
        it = iter(sampler)
        for _ in range(4):
            consumed += ds.conversations(next(it))
    state = ranks[1].state_dict()
    again = PackedSFTDataset(store, 32)  # a fresh process: the same plan
    again.load_state_dict(ds.state_dict())
    for rank in range(3):
        sampler = ResumableDistributedSampler(again, num_replicas=3, rank=rank, seed=3, pad=False)
        sampler.load_state_dict(state)
        for index in sampler:
            consumed += again.conversations(index)
    assert sorted(consumed) == list(range(len(lengths)))


def test_full_bins_cu_seqlens_and_boundary_labels(tmp_path: Path) -> None:
    # 16 + 16 and 10 + 6 fill two bins of 16 exactly; 5 leaves padding
    store, convs = write_store(tmp_path / "sft", [16, 10, 6, 5, 16])
    ds = PackedSFTDataset(store, 16)
    for i in range(len(ds)):
        sample = ds[i]
        records = ds.conversations(i)
        bounds = np.cumsum([0] + [len(convs[r][0]) for r in records]).tolist()
        cu = sample["cu_seqlens"].tolist()
        assert cu[: len(bounds)] == bounds and set(cu[len(bounds) :]) <= {16}
        labels = sample["labels"].tolist()
        for number, record in enumerate(records):
            tokens, mask = convs[record]
            begin, end = bounds[number], bounds[number + 1]
            assert labels[end - 1] == IGNORE_INDEX  # the last token of a conversation predicts nothing
            assert labels[begin : end - 1] == [
                int(tokens[t + 1]) if mask[t + 1] else IGNORE_INDEX for t in range(len(tokens) - 1)
            ]
            assert sample["position_ids"][begin:end].tolist() == list(range(end - begin))
        assert all(label == IGNORE_INDEX for label in labels[bounds[-1] :])
