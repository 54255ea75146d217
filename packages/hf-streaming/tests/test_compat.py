"""Compat mode: the seed's order and samples; resumes only on the topology it was saved on."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer
from torchdata.stateful_dataloader import StatefulDataLoader

from tokenloom.formats import ResumeMismatchError
from tokenloom.hf_streaming import StreamingHuggingFaceDataset, merge_rank_states


@pytest.fixture
def jsonl(tmp_path):
    import random

    from conftest import make_text

    rng = random.Random(5)
    path = tmp_path / "c.jsonl"
    with open(path, "w") as f:
        for i in range(120):
            text = (
                "" if i % 17 == 0 else make_text(rng, i)
            )  # texts that encode to nothing are skipped, as the seed does
            f.write(json.dumps({"text": text}) + "\n")
    return [str(path)]


def seed_reference(files, tokenizer_dir, *, seq_len, seed, buffer, rank, world_size, epoch=0):
    """KempnerForge's StreamingHuggingFaceDataset.__iter__, as documented (HF shuffle, rank stride, EOS join)."""
    windows = seed_windows(
        files, str(tokenizer_dir / "tokenizer.json"), seq_len, seed + epoch, buffer, rank, world_size
    )
    return [(window[:-1], window[1:]) for window in windows]


def seed_windows(files, tokenizer_file: str, seq_len: int, seed: int, buffer: int, rank: int, world_size: int):
    """The seed's windows of seq_len + 1 ids: HF shuffle, every world_size-th document from rank, EOS 0 joined."""
    import datasets

    stream = datasets.load_dataset("json", data_files=files, split="train", streaming=True)
    stream = stream.shuffle(seed=seed, buffer_size=buffer)
    tokenizer = Tokenizer.from_file(tokenizer_file)
    chunk, pending = seq_len + 1, []
    for doc_idx, example in enumerate(stream):
        if doc_idx % world_size != rank:
            continue
        tokens = tokenizer.encode(example["text"], add_special_tokens=False).ids
        if not tokens:
            continue
        pending.extend(tokens)
        pending.append(0)
        while len(pending) >= chunk:
            window, pending = pending[:chunk], pending[chunk:]
            yield window


class SeedLoop(torch.utils.data.IterableDataset):
    """KempnerForge's StreamingHuggingFaceDataset.__iter__ as a dataset (no worker handling of its own:
    inside a DataLoader worker, ``datasets`` splits the source shards between workers)."""

    def __init__(self, files, tokenizer_dir, *, seq_len, seed, buffer, rank, world_size):
        super().__init__()
        self.files, self.tokenizer_file = files, str(tokenizer_dir / "tokenizer.json")
        self.seq_len, self.seed, self.buffer, self.rank, self.world_size = seq_len, seed, buffer, rank, world_size

    def __iter__(self):
        windows = seed_windows(
            self.files, self.tokenizer_file, self.seq_len, self.seed, self.buffer, self.rank, self.world_size
        )
        for window in map(torch.tensor, windows):
            yield {"input_ids": window[:-1], "labels": window[1:]}


@pytest.fixture(scope="module")
def shard_corpora(tmp_path_factory):
    """The same 240 documents as 1 source shard and as 4."""
    import random

    from conftest import make_text

    rng = random.Random(11)
    lines = [json.dumps({"text": "" if i % 17 == 0 else make_text(rng, i)}) + "\n" for i in range(240)]
    root = tmp_path_factory.mktemp("shards")
    corpora = {}
    for shards in (1, 4):
        files = []
        for k in range(shards):
            path = root / f"s{shards}_{k}.jsonl"
            path.write_text("".join(lines[k::shards]))
            files.append(str(path))
        corpora[shards] = files
    return corpora


def _through_loader(dataset, num_workers):
    timeout = 120 if num_workers else 0
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=num_workers, timeout=timeout)
    return [(s["input_ids"].tolist(), s["labels"].tolist()) for s in loader]


@pytest.mark.parametrize("shards", [1, 4])
@pytest.mark.parametrize("num_workers", [0, 1, 2, 4])
def test_compat_equals_the_seed_loop_in_a_dataloader(shard_corpora, tokenizer_dir, shards, num_workers):
    """Sample for sample, in the DataLoader's order, on 1-3 ranks: no document lost or repeated."""
    files = shard_corpora[shards]
    for world_size in (1, 2, 3):
        for rank in range(world_size):
            topology = {"rank": rank, "world_size": world_size}
            ours = _through_loader(compat(files, tokenizer_dir, shuffle_buffer_size=32, **topology), num_workers)
            seed = SeedLoop(files, tokenizer_dir, seq_len=12, seed=9, buffer=32, **topology)
            reference = _through_loader(seed, num_workers)
            assert len(reference) > 20
            assert ours == reference, (world_size, rank, len(ours), len(reference))


def compat(files, tokenizer_dir, **kwargs):
    options = {"seed": 9, "shuffle_buffer_size": 16, "mode": "compat", "data_files": files}
    options.update(kwargs)
    return StreamingHuggingFaceDataset("json", "train", "text", 12, str(tokenizer_dir), **options)


@pytest.mark.parametrize("world_size", [1, 2])
def test_compat_equals_the_seed_semantics(jsonl, tokenizer_dir, world_size):
    for rank in range(world_size):
        ours = [
            (s["input_ids"].tolist(), s["labels"].tolist())
            for s in compat(jsonl, tokenizer_dir, rank=rank, world_size=world_size)
        ]
        reference = seed_reference(
            jsonl, tokenizer_dir, seq_len=12, seed=9, buffer=16, rank=rank, world_size=world_size
        )
        assert len(ours) > 10
        assert ours == reference


def test_compat_packing_masks_by_eos_like_the_seed(jsonl, tokenizer_dir):
    for sample in compat(jsonl, tokenizer_dir, pack_sequences=True):
        after_eos = torch.cat([torch.tensor([False]), sample["input_ids"][:-1] == 0])
        assert (sample["labels"][sample["input_ids"] == 0] == -100).all()
        assert sample["doc_ids"].tolist() == torch.cumsum(after_eos.long(), 0).tolist()


def test_compat_resume_same_topology_continues_exactly(jsonl, tokenizer_dir):
    full = [b["input_ids"] for b in StatefulDataLoader(compat(jsonl, tokenizer_dir), batch_size=2)]
    loader = StatefulDataLoader(compat(jsonl, tokenizer_dir), batch_size=2)
    iterator = iter(loader)
    for _ in range(5):
        next(iterator)
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = StatefulDataLoader(compat(jsonl, tokenizer_dir), batch_size=2)
    resumed.load_state_dict(state)
    rest = [b["input_ids"] for b in resumed]
    assert len(rest) == len(full) - 5
    assert all(torch.equal(a, b) for a, b in zip(rest, full[5:], strict=True))


def test_compat_refuses_a_topology_change(jsonl, tokenizer_dir):
    states = []
    for rank in range(2):
        ds = compat(jsonl, tokenizer_dir, rank=rank, world_size=2)
        stream = iter(ds)
        next(stream)
        states.append(ds.state_dict())
    merged = merge_rank_states(states)
    with pytest.raises(ResumeMismatchError, match="compat mode cannot change the topology"):
        compat(jsonl, tokenizer_dir, rank=0, world_size=3).load_state_dict(merged)
    same = compat(jsonl, tokenizer_dir, rank=1, world_size=2)
    same.load_state_dict(merged)
    loader = StatefulDataLoader(same, batch_size=1, num_workers=2, timeout=60)
    with pytest.raises(ResumeMismatchError, match="compat mode cannot change the topology"):
        next(iter(loader))
