"""PackedSFTDataset: whole sft conversations best-fit packed into seq_len, labels from loss_mask."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch

from tokenloom.datasets import IGNORE_INDEX, PackedSFTDataset, best_fit_decreasing, collate
from tokenloom.formats import ConfigError, MissingKeyError, RecordStoreWriter, ResumeMismatchError
from tokenloom.sampler import ResumableDistributedSampler


def conversations(n: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(3, 40))
        tokens = rng.integers(1, 500, length)
        mask = np.zeros(length, dtype=np.uint8)
        start = int(rng.integers(1, length - 1))
        mask[start:] = 1  # a prompt, then the trained answer
        out.append((tokens, mask))
    return out


def write_store(path: Path, convs: list[tuple[np.ndarray, np.ndarray]]) -> Path:
    with RecordStoreWriter(path, train_type="sft", dtype="uint16", key_dtypes={"loss_mask": "bool"}) as writer:
        for tokens, mask in convs:
            writer.add_record({"sequence": tokens, "loss_mask": mask, "position_ids": np.arange(len(tokens))})
    return path


def test_every_conversation_once_with_masked_labels(tmp_path: Path) -> None:
    convs = conversations(60)
    ds = PackedSFTDataset(write_store(tmp_path / "sft", convs), 64)
    lengths = np.array([len(t) for t, _ in convs])
    assert len(ds) == int(best_fit_decreasing(lengths, 64).max()) + 1
    assert ds.packing_efficiency == pytest.approx(lengths.sum() / (len(ds) * 64))
    seen = []
    for i in range(len(ds)):
        sample = ds[i]
        assert all(v.shape[-1] in (64, 65) for v in sample.values())
        position = 0
        for record in ds.conversations(i):
            tokens, mask = convs[record]
            n = len(tokens)
            assert sample["input_ids"][position : position + n].tolist() == tokens.tolist()
            assert sample["position_ids"][position : position + n].tolist() == list(range(n))
            labels = sample["labels"][position : position + n].tolist()
            # label t predicts token t + 1 of the same conversation, only where that token is trained
            expected = [int(tokens[t + 1]) if mask[t + 1] else IGNORE_INDEX for t in range(n - 1)]
            if position + n < 64:
                expected.append(IGNORE_INDEX)  # never across into the next conversation or padding
            assert labels[: len(expected)] == expected
            assert position in sample["cu_seqlens"].tolist()
            position += n
            seen.append(record)
        assert (sample["labels"][position:] == IGNORE_INDEX).all()
    assert sorted(seen) == list(range(60))


def test_too_long_conversations_are_counted_or_refused(tmp_path: Path) -> None:
    convs = conversations(20)
    store = write_store(tmp_path / "sft", convs)
    longest = max(len(t) for t, _ in convs)
    ds = PackedSFTDataset(store, longest - 1)
    over = sum(len(t) > longest - 1 for t, _ in convs)
    assert ds.num_too_long == over > 0
    assert sum(len(ds.conversations(i)) for i in range(len(ds))) == 20 - over
    with pytest.raises(ConfigError, match="longer than seq_len"):
        PackedSFTDataset(store, longest - 1, too_long="error")


def test_a_store_with_nothing_to_pack_says_why_and_what_to_do(tmp_path: Path) -> None:
    """Every record too long, or none at all: the hint says what to change (it was the generic "See --help")."""
    convs = conversations(5)
    with pytest.raises(ConfigError, match="5 records, 5 of them longer") as caught:
        PackedSFTDataset(write_store(tmp_path / "long", convs), 2)
    assert caught.value.field == "seq_len" and "--seq-len" in str(caught.value)
    with pytest.raises(ConfigError, match="holds 0 records") as caught:
        PackedSFTDataset(write_store(tmp_path / "empty", []), 64)
    assert "tokenize --train-type sft" in str(caught.value)


def test_plan_is_deterministic_and_resumes_with_the_sampler(tmp_path: Path) -> None:
    store = write_store(tmp_path / "sft", conversations(80, seed=3))
    a, b = PackedSFTDataset(store, 48), PackedSFTDataset(store, 48)
    assert [a.conversations(i) for i in range(len(a))] == [b.conversations(i) for i in range(len(b))]
    b.load_state_dict(a.state_dict())
    with pytest.raises(ResumeMismatchError):
        PackedSFTDataset(store, 64).load_state_dict(a.state_dict())
    # two ranks consume 3 samples each, then one rank resumes: every sample exactly once
    ranks = [ResumableDistributedSampler(a, num_replicas=2, rank=r, seed=7) for r in range(2)]
    taken = []
    for sampler in ranks:
        it = iter(sampler)
        taken += [next(it) for _ in range(3)]
    resumed = ResumableDistributedSampler(a, num_replicas=1, rank=0, seed=7)
    resumed.load_state_dict(ranks[0].state_dict())
    rest = list(resumed)
    assert sorted(taken + rest) == list(range(len(a)))


def test_batches_through_a_dataloader(tmp_path: Path) -> None:
    ds = PackedSFTDataset(write_store(tmp_path / "sft", conversations(30)), 64)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=collate)
    batch = next(iter(loader))
    assert batch["input_ids"].shape == (4, 64) and batch["labels"].dtype == torch.int64
    assert torch.equal(batch["input_ids"][1], ds[1]["input_ids"])
    assert torch.equal(batch["labels"][1], ds[1]["labels"])


def test_store_without_loss_mask(tmp_path: Path) -> None:
    with RecordStoreWriter(tmp_path / "seq", dtype="uint16") as writer:
        writer.add_record({"sequence": [1, 2, 3]})
    with pytest.raises(MissingKeyError):
        PackedSFTDataset(tmp_path / "seq", 8)


def test_the_same_store_serves_sft_windows(tmp_path: Path) -> None:
    from tokenloom.datasets import DatasetFactory

    convs = conversations(10)
    ds = DatasetFactory.load("sft", write_store(tmp_path / "sft", convs), 16)
    tokens = np.concatenate([t for t, _ in convs])
    mask = np.concatenate([m for _, m in convs])
    sample = ds[0]
    assert sample["input_ids"].tolist() == tokens[:16].tolist()
    assert sample["labels"].tolist() == [
        int(t) if m else IGNORE_INDEX for t, m in zip(tokens[1:17], mask[1:17], strict=True)
    ]


def test_record_writer_output_reads_as_astrai_reads_it(tmp_path: Path) -> None:
    """dpo records from RecordStoreWriter, read the way AstrAI's load_bin + fetch_record do, and by DatasetFactory."""
    import json

    from tokenloom.datasets import DatasetFactory

    pairs = [([1, 2, 3], [0, 1, 1], [1, 4], [0, 1]), ([5, 6], [0, 1], [5, 7, 8, 9], [0, 0, 1, 1])]
    mask_dtypes = {"chosen_mask": "bool", "rejected_mask": "bool"}
    with RecordStoreWriter(tmp_path / "dpo", train_type="dpo", dtype="uint16", key_dtypes=mask_dtypes) as writer:
        for chosen, chosen_mask, rejected, rejected_mask in pairs:
            writer.add_record(
                {"chosen": chosen, "chosen_mask": chosen_mask, "rejected": rejected, "rejected_mask": rejected_mask}
            )
    meta = json.loads((tmp_path / "dpo" / "meta.json").read_text())
    for key, column in zip(("chosen", "chosen_mask", "rejected", "rejected_mask"), range(4), strict=True):
        info = meta[key]
        data = np.memmap(tmp_path / "dpo" / f"{key}.bin", dtype=info["dtype"], mode="c", shape=tuple(info["shape"]))
        offsets = info["offsets"]
        for i, pair in enumerate(pairs):
            assert torch.from_numpy(data[offsets[i] : offsets[i + 1]]).to(torch.long).tolist() == pair[column]
    ds = DatasetFactory.load("dpo", tmp_path / "dpo")
    assert ds[1]["rejected"].tolist() == [5, 7, 8, 9] and ds[1]["rejected_mask"].tolist() == [False, False, True, True]


@pytest.mark.parametrize("seq_len", [40, 64, 97])
def test_batches_equal_the_one_sample_builder_over_a_store_of_two_parts(tmp_path: Path, seq_len: int) -> None:
    """The slice-by-slice batch is what build_batch gives for the same packed documents (two meta.json parts)."""
    from tokenloom.datasets._sample import build_batch

    convs = [*conversations(50, seed=3), (np.arange(1, seq_len + 1), np.ones(seq_len, np.uint8))]  # one exactly full
    write_store(tmp_path / "sft" / "a", convs[:20])
    write_store(tmp_path / "sft" / "b", convs[20:])
    ds = PackedSFTDataset(tmp_path / "sft", seq_len, pad_id=7)
    assert len(ds.store.parts) == 2
    indices = [*range(len(ds)), -1, -len(ds)]
    batch = ds.__getitems__(indices).batched
    for row, index in enumerate(indices):
        window = np.full(seq_len + 1, 7, dtype=np.int64)
        ignore, docs, position = np.ones(seq_len + 1, bool), np.empty(seq_len + 1, np.int64), 0
        records = ds.conversations(index % len(ds))
        for number, record in enumerate(records):
            tokens, mask = convs[record]
            window[position : position + len(tokens)] = tokens
            ignore[position : position + len(tokens)] = mask == 0
            docs[position : position + len(tokens)] = number
            position += len(tokens)
        docs[position:] = len(records)
        expected = build_batch(
            window[None], doc_ids=docs[None], label_ignore=ignore[None], packing="documents", position_ids=True,
            cu_seqlens=True,
        )  # fmt: skip
        assert sorted(expected) == sorted(batch)
        for key, value in expected.items():
            assert batch[key][row].numpy().tolist() == value[0].tolist(), (index, key)
    with pytest.raises(IndexError):
        ds.__getitems__([len(ds)])


def test_a_store_whose_sequence_is_not_integer_is_refused(tmp_path: Path) -> None:
    """A record store whose ``sequence`` is float (an AstrAI store saved from a float tensor, or an .h5 store):
    a FormatError naming the key, not token ids truncated from 1.5 to 1 without a word."""
    from tokenloom.formats import FormatError

    masks = {"loss_mask": "bool", "sequence": "float32"}
    with RecordStoreWriter(tmp_path / "f", train_type="sft", dtype="uint16", key_dtypes=masks) as writer:
        writer.add_record({"sequence": np.array([1.5, 2.0], np.float32), "loss_mask": [0, 1]})
    with pytest.raises(FormatError, match="sequence") as caught:
        PackedSFTDataset(tmp_path / "f", 8)
    assert caught.value.field == "sequence"


def test_a_negative_token_id_in_a_signed_sequence_is_refused(tmp_path: Path) -> None:
    """A signed ``sequence`` (AstrAI's save_bin of an int32 tensor, say) with a negative id: a TokenRangeError naming
    the file, record and field, not -5 handed to the embedding as a token."""
    from tokenloom.formats import TokenRangeError

    convs = conversations(12, seed=4)
    with RecordStoreWriter(tmp_path / "s", train_type="sft", dtype="int32", key_dtypes={"loss_mask": "bool"}) as w:
        for tokens, mask in convs:
            w.add_record({"sequence": tokens, "loss_mask": mask})
    record, at = 7, 2
    data = np.memmap(tmp_path / "s" / "sequence.bin", dtype=np.int32, mode="r+")
    begin = sum(len(t) for t, _ in convs[:record])
    data[begin + at] = -5  # as a writer that never checked would leave it
    data.flush()
    del data
    ds = PackedSFTDataset(tmp_path / "s", 64)
    sample = next(i for i in range(len(ds)) if record in ds.conversations(i))
    clean = next(i for i in range(len(ds)) if record not in ds.conversations(i))
    assert ds[clean]["input_ids"].min() >= 0  # the other samples still read
    with pytest.raises(TokenRangeError, match="negative") as caught:
        ds.__getitems__([clean, sample])
    error = caught.value
    assert (error.record, error.field, error.offset) == (record, "sequence", (begin + at) * 4)
    assert error.path is not None and error.path.endswith("sequence.bin") and "re-create" in str(error)


def test_batches_cross_to_workers_compact_and_equal(tmp_path: Path) -> None:
    """A worker's batch is pickled as its compact form (tokens in the store's dtype, mask, segment lengths) and
    rebuilt equal; a batch a collate changed is sent as its tensors."""
    import pickle

    from tokenloom.datasets import WindowBatch

    ds = PackedSFTDataset(write_store(tmp_path / "sft", conversations(40)), 64, pad_id=3)
    indices = np.array([0, 2, 1, -1])
    batch: Any = ds.__getitems__(cast(Any, indices))
    assert indices.tolist() == [0, 2, 1, -1]  # the caller's array, untouched
    expected = batch.batched
    for sent in (batch, WindowBatch(None, batch.batched, compact=batch.compact)):
        data = pickle.dumps(sent)
        assert len(data) < sum(v.numel() * v.element_size() for v in expected.values()) / 5
        back = pickle.loads(data)
        back = back.batched if hasattr(back, "batched") else back
        assert all(torch.equal(back[key], value) for key, value in expected.items())
    changed = WindowBatch(None, batch.batched, compact=batch.compact)
    changed["labels"] = changed["labels"].clone().fill_(IGNORE_INDEX)
    assert (pickle.loads(pickle.dumps(changed))["labels"] == IGNORE_INDEX).all()
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=1, collate_fn=collate)
    first = next(iter(loader))
    assert type(first) is dict
    assert all(torch.equal(first[key], value) for key, value in ds.__getitems__([0, 1, 2, 3]).batched.items())


def test_the_fingerprint_keys_on_the_content_not_the_path(tmp_path: Path) -> None:
    """A store moved (or read from another mount) keeps its fingerprint, so a saved state still resumes; other
    conversations give another one."""
    convs = conversations(30)
    first = PackedSFTDataset(write_store(tmp_path / "a", convs), 64)
    moved = PackedSFTDataset(shutil.copytree(tmp_path / "a", tmp_path / "b"), 64)
    assert moved.fingerprint() == first.fingerprint()
    moved.load_state_dict(first.state_dict())
    other = PackedSFTDataset(write_store(tmp_path / "c", conversations(30, seed=1)), 64)
    assert other.fingerprint() != first.fingerprint()
    with pytest.raises(ResumeMismatchError):
        other.load_state_dict(first.state_dict())
