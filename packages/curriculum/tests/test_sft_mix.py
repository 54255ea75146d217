"""A curriculum whose phases mix an sft record store with pretraining buckets (issue 37, item 5): the sft
bucket's samples are PackedSFTDataset's (labels -100 where its loss_mask is 0), and a resume from a state saved
mid-phase consumes exactly what an uninterrupted run does: local, and with both buckets on a real S3 server."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest
from curriculum_helpers import make_corpus
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from tokenloom.curriculum import CurriculumConfig, CurriculumDataset, CurriculumPlan, Phase
from tokenloom.datasets import PackedSFTDataset, collate
from tokenloom.formats import ConfigError, RecordStoreWriter, RemoteOptions, open_records
from tokenloom.formats.keyed import RecordH5Writer
from tokenloom.sampler import ResumableDistributedSampler, sampler_state_from_loader

SEED = 5
SEQ_LEN = 64
PHASES = (Phase(duration_tokens=2500, mix={"web": 0.7, "sft": 0.3}), Phase(duration_tokens=2500, mix={"sft": 1}))


def write_sft(directory: Path, count: int, seed: int, writer_class: type = RecordStoreWriter) -> None:
    """Conversations of 5-40 tokens: a prompt (mask 0) then an answer (mask 1); token ids tell them apart."""
    rng = np.random.default_rng(seed)
    options = {"train_type": "sft", "dtype": "uint16", "key_dtypes": {"loss_mask": "bool"}}
    with writer_class(directory, **options) as writer:
        for i in range(count):
            length = int(rng.integers(5, 40))
            mask = np.zeros(length, dtype=bool)
            mask[int(rng.integers(1, length)) :] = True
            tokens = (np.arange(length) + 100 * (i % 600) + 1).astype(np.uint16)
            writer.add_record({"sequence": tokens, "loss_mask": mask, "position_ids": np.arange(length)})


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    root = make_corpus(tmp_path / "data", {"web": 200})
    write_sft(root / "train" / "sft", 260, seed=1)
    write_sft(root / "val" / "sft", 6, seed=2)
    return root


def _config(path: object, **extra: object) -> CurriculumConfig:
    return CurriculumConfig(path=path, seq_len=SEQ_LEN, packing=True, curriculum=PHASES, **extra)  # type: ignore[arg-type]


def _identities(batch) -> list[tuple[int, bytes, bytes]]:
    rows = zip(batch["bucket"].tolist(), batch["input_ids"].numpy(), batch["labels"].numpy(), strict=True)
    return [(bucket, ids.tobytes(), labels.tobytes()) for bucket, ids, labels in rows]


def _uninterrupted(ds: CurriculumDataset) -> list[tuple[int, bytes, bytes]]:
    sampler = ResumableDistributedSampler(ds, num_replicas=1, rank=0, shuffle=False, seed=SEED)
    return [
        x for batch in DataLoader(ds, sampler=sampler, batch_size=5, collate_fn=collate) for x in _identities(batch)
    ]


def _resumed(make: object, stop: int) -> tuple[list[tuple[int, bytes, bytes]], dict]:
    """``stop`` samples by one loader, its state saved; then a new dataset and a two-worker loader go on."""
    first = make()  # type: ignore[operator]
    sampler = ResumableDistributedSampler(first, num_replicas=1, rank=0, shuffle=False, seed=SEED)
    loader = StatefulDataLoader(first, sampler=sampler, batch_size=5, collate_fn=collate)
    seen: list[tuple[int, bytes, bytes]] = []
    for batch in loader:
        seen += _identities(batch)
        if len(seen) >= stop:
            break
    state = sampler_state_from_loader(loader.state_dict())
    saved = first.state_dict(consumed=int(state["consumed"]))
    second = make()  # type: ignore[operator]
    second.load_state_dict(saved)  # the data fingerprints (the sft store's packing plan too) match
    sampler = ResumableDistributedSampler(second, num_replicas=1, rank=0, shuffle=False, seed=SEED)
    sampler.load_state_dict(state)
    loader = StatefulDataLoader(second, sampler=sampler, batch_size=5, collate_fn=collate, num_workers=2, timeout=120)
    return seen + [x for batch in loader for x in _identities(batch)], saved


def _check_sft_samples(ds: CurriculumDataset, store_path: Path) -> None:
    """The sft bucket's samples are PackedSFTDataset's, without cu_seqlens; a prompt token is never a label."""
    packed = PackedSFTDataset(open_records(store_path), SEQ_LEN)
    sft = ds.buckets.index("sft")
    _, bucket, inner = ds.locate(np.arange(len(ds)))
    rows = np.flatnonzero(bucket == sft)[:40].tolist()
    batch = ds.__getitems__(rows).batched
    assert "cu_seqlens" not in batch and (batch["bucket"] == sft).all()
    expected = packed.__getitems__(inner[rows].tolist()).batched
    for key in ("input_ids", "labels", "position_ids", "doc_ids"):
        assert np.array_equal(batch[key].numpy(), expected[key].numpy()), key
    assert (batch["labels"] == -100).any() and (batch["labels"] != -100).any()
    counted = ds.budget_tokens(np.asarray(rows))  # input_tokens: the conversations' tokens, not the padding
    lengths = np.diff(packed.store.parts[0].offsets["sequence"])
    assert counted.tolist() == [int(lengths[packed.conversations(int(i))].sum()) for i in inner[rows]]
    assert counted.sum() < len(rows) * SEQ_LEN


def test_a_curriculum_mixes_a_local_sft_store_with_pretraining_buckets_and_resumes_exactly(mixed: Path) -> None:
    make = lambda: CurriculumDataset(_config(mixed), seed=SEED, plan_cache_dir=mixed.parent / "plans")  # noqa: E731
    ds = make()
    assert ds.buckets == ["sft", "web"]
    (_, p1), _ = ds.schedule.phase_bounds
    _check_sft_samples(ds, mixed / "train" / "sft")
    _, bucket, _ = ds.locate(np.arange(p1))
    assert set(bucket.tolist()) == {0, 1}  # phase 1 draws from both
    reference = _uninterrupted(ds)
    assert len(reference) == len(ds)
    resumed, saved = _resumed(make, p1 // 2)  # mid-phase 1
    assert 0 < saved["consumed"] < p1
    assert resumed == reference
    plan = CurriculumPlan(_config(mixed), seed=SEED, plan_cache_dir=mixed.parent / "plans")  # plan / validate
    assert len(plan) == len(ds) and plan.identity() == ds.identity()
    val = ds.val_dataset("sft")
    assert len(val) >= 1 and "labels" in val[0] and "cu_seqlens" not in val[0]


def test_fixed_windows_over_an_sft_store_are_refused(mixed: Path) -> None:
    with pytest.raises(ConfigError, match="sft record store") as caught:
        CurriculumDataset(CurriculumConfig(path=mixed, seq_len=SEQ_LEN, packing=False), seed=SEED)
    assert caught.value.field == "packing"


def test_loss_tokens_of_an_sft_bucket_are_its_trained_labels(mixed: Path) -> None:
    ds = CurriculumDataset(_config(mixed, budget_unit="loss_tokens"), seed=SEED, plan_cache_dir=mixed.parent / "p")
    _, bucket, _ = ds.locate(np.arange(len(ds)))
    rows = np.flatnonzero(bucket == ds.buckets.index("sft"))[:30].tolist()
    labels = ds.__getitems__(rows).batched["labels"]
    assert np.array_equal(ds.budget_tokens(np.asarray(rows)), (labels != -100).sum(1).numpy())


def test_an_sft_store_and_pretraining_buckets_in_s3_give_the_local_samples_and_resume_exactly(
    seaweed, mixed: Path, tmp_path: Path
) -> None:
    prefix = f"mix-{uuid.uuid4().hex[:8]}"
    seaweed.upload_tree(mixed, prefix)
    url = f"s3://{seaweed.bucket}/{prefix}"

    def make() -> CurriculumDataset:
        remote = RemoteOptions.from_keywords(storage_options=seaweed.storage_options(), block_cache_dir=tmp_path / "c")
        return CurriculumDataset(_config(url, remote=remote), seed=SEED, plan_cache_dir=tmp_path / "plans")

    ds = make()
    _check_sft_samples(ds, mixed / "train" / "sft")  # read from the bucket: the local store's packed samples
    local = CurriculumDataset(_config(mixed), seed=SEED, plan_cache_dir=tmp_path / "local-plans")
    reference = _uninterrupted(ds)
    assert reference == _uninterrupted(local)  # the same samples as the local curriculum, sft labels included
    assert any(url in name for name in ds.data_objects())  # the store's objects are in the saved state
    (_, p1), _ = ds.schedule.phase_bounds
    resumed, _ = _resumed(make, p1 // 3)
    assert resumed == reference


def test_an_h5_sft_store_is_an_sft_bucket_too(mixed: Path, tmp_path: Path) -> None:
    """tokenize --format h5's record store (data.h5): its conversations packed and masked as bin-meta's (it was
    served as plain documents, every prompt token trained)."""
    pytest.importorskip("h5py")
    for split, count, seed in (("train", 260, 1), ("val", 6, 2)):
        shutil.rmtree(mixed / split / "sft")
        write_sft(mixed / split / "sft" / "data.h5", count, seed, writer_class=RecordH5Writer)
    ds = CurriculumDataset(_config(mixed), seed=SEED, plan_cache_dir=tmp_path / "plans")
    _check_sft_samples(ds, mixed / "train" / "sft")


@pytest.mark.parametrize("train_type", ["dpo", "grpo"])
@pytest.mark.parametrize("h5", [False, True])
def test_a_dpo_or_grpo_store_as_a_bucket_is_named(mixed: Path, train_type: str, h5: bool) -> None:
    """Not a token store: the error says which record store it is (it was a ShapeMismatchError or a
    MissingKeyError saying to re-create the store or pass key=)."""
    if h5:
        pytest.importorskip("h5py")
    for split in ("train", "val"):
        shutil.rmtree(mixed / split / "sft")
        path = mixed / split / "sft" / ("data.h5" if h5 else "")
        writer = (RecordH5Writer if h5 else RecordStoreWriter)(path, train_type=train_type, dtype="uint16")
        with writer:
            for i in range(8):
                tokens = np.arange(5 + i, dtype=np.uint16) + 1
                if train_type == "dpo":
                    ones = np.ones(5 + i, dtype=np.uint8)
                    pair = {"chosen": tokens, "rejected": tokens, "chosen_mask": ones, "rejected_mask": ones}
                    writer.add_record(pair)
                else:
                    reply = [tokens[:3], tokens[:4]]
                    masks = [np.ones(3, np.uint8), np.ones(4, np.uint8)]
                    rewards = np.ones(2, np.float32)
                    writer.add_record({"prompts": tokens, "responses": reply, "masks": masks, "rewards": rewards})
    with pytest.raises(ConfigError, match=f"bucket 'sft' is a {train_type} record store"):
        CurriculumDataset(_config(mixed), seed=SEED)


@pytest.mark.parametrize("unit", ["input_tokens", "loss_tokens"])
def test_resumes_across_world_sizes_and_workers_consume_the_uninterrupted_samples_once(
    mixed: Path, tmp_path: Path, unit: str
) -> None:
    """Saves before, at and after the phase boundary, each resumed on another (world size, workers): every
    position consumed once, the uninterrupted run's (bucket, input_ids, labels) at each."""
    from test_oracle import _loaders

    make = lambda: CurriculumDataset(_config(mixed, budget_unit=unit), seed=SEED, plan_cache_dir=tmp_path)  # noqa: E731
    ds = make()
    reference = _uninterrupted(ds)
    (_, p1), _ = ds.schedule.phase_bounds
    seen: dict[int, tuple[int, bytes, bytes]] = {}
    state: dict | None = None
    topologies = [(1, 0), (2, 2), (4, 1), (3, 0), (2, 0)]
    for (world, workers), target in zip(topologies, [p1 // 3, p1 - 1, p1 + 2, len(ds) - 4, len(ds) + 2], strict=True):
        start = 0 if state is None else int(state["consumed"])
        loaders = _loaders(make(), world, workers, state)
        iterators, taken = [iter(loader) for loader in loaders], [0] * world
        for _ in range(max(1, (target - start) // world)):
            for rank, iterator in enumerate(iterators):
                batch = next(iterator, None)
                for identity in _identities(batch) if batch is not None else []:
                    position = start + rank + world * taken[rank]
                    assert position not in seen, f"position {position} consumed twice"
                    seen[position], taken[rank] = identity, taken[rank] + 1
        state = sampler_state_from_loader(loaders[0].state_dict())
        del iterators, loaders
    assert sorted(seen) == list(range(len(ds)))
    assert [seen[p] for p in range(len(ds))] == reference
