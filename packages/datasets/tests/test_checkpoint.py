"""SamplerCheckpoint: the data position through torch.distributed.checkpoint, saved on 2 ranks, resumed on 3."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from pathlib import Path
from typing import cast

import numpy as np
import pytest
from datasets_helpers import write_random_docs
from torch.distributed.checkpoint import state_dict_loader, state_dict_saver

from tokenloom.datasets import MemoryMappedDataset, SamplerCheckpoint
from tokenloom.datasets._checkpoint import STATE_ENTRY
from tokenloom.formats import ConfigError, FormatError, ResumeMismatchError
from tokenloom.sampler import ResumableDistributedSampler
from tokenloom.testing.ranks import run_ranks as run_processes

SEQ_LEN, NUM_SAMPLES = 16, 36  # save: 2 ranks x 3 batches x 2 = 12; resume: 24 left = 3 ranks x 4 batches x 2


def write_tokens(root: Path, seed: int = 4) -> MemoryMappedDataset:
    write_random_docs(root, NUM_SAMPLES * (SEQ_LEN + 1), seed=seed, vocab_size=1000, max_length=40)
    return MemoryMappedDataset(root, seq_len=SEQ_LEN, pack_sequences=True)


def run_ranks(worker, world_size: int, *args) -> None:
    # fork: the ranks start at once with torch already imported (a spawned rank imports it again: 10-20 s each)
    run_processes(worker.run, (world_size, *args), world_size, timeout_s=180, start_method="fork")


def test_saved_on_two_gloo_ranks_resumed_on_three_consumes_every_sample_once(tmp_path, monkeypatch):
    dataset = write_tokens(tmp_path / "tokens")
    assert len(dataset) == NUM_SAMPLES
    index_of = {
        hashlib.blake2b(dataset[i]["input_ids"].numpy().astype("int64").tobytes(), digest_size=8).hexdigest(): i
        for i in range(NUM_SAMPLES)
    }
    assert len(index_of) == NUM_SAMPLES
    monkeypatch.syspath_prepend(os.path.dirname(__file__))
    worker = importlib.import_module("_dcp_worker")
    run_ranks(worker, 2, "save", str(tmp_path / "tokens"), str(tmp_path), 3)
    run_ranks(worker, 3, "load", str(tmp_path / "tokens"), str(tmp_path), 0)

    def indices(name: str) -> list[list[int]]:
        return [[index_of[h] for h in batch] for batch in json.loads((tmp_path / name).read_text())]

    order = ResumableDistributedSampler(NUM_SAMPLES, 1, 0, seed=99).indices_at(np.arange(NUM_SAMPLES))
    for world, phase, start, batches in ((2, "save", 0, 3), (3, "load", 12, 4)):
        for rank in range(world):  # rank r, batch b, row i: global position start + (2 b + i) W + r
            expected = [[int(order[start + (2 * b + i) * world + rank]) for i in range(2)] for b in range(batches)]
            assert indices(f"{phase}-rank{rank}.json") == expected, (phase, rank)
    consumed = [
        i
        for world, phase in ((2, "save"), (3, "load"))
        for r in range(world)
        for b in indices(f"{phase}-rank{r}.json")
        for i in b
    ]
    assert sorted(consumed) == list(range(NUM_SAMPLES))  # exactly once: nothing repeated, nothing skipped
    lost = [index_of[h] for r in range(2) for h in json.loads((tmp_path / f"lost-rank{r}.json").read_text())]
    assert set(lost) <= set(consumed[12:])  # read after the checkpoint, so served again after the resume

    # the same 2-rank checkpoint on 1 process (no process group): the data entry alone, the order from 12 on
    single = ResumableDistributedSampler(dataset, 1, 0, seed=99)
    state_dict_loader.load({"data": SamplerCheckpoint(single)}, checkpoint_id=tmp_path / "dcp", no_dist=True)
    assert list(single) == order[12:].tolist()


def test_single_process_round_trip_and_a_foreign_state_is_refused(tmp_path):
    dataset = write_tokens(tmp_path / "a")
    sampler = ResumableDistributedSampler(dataset, 1, 0, seed=3)
    iterator = iter(sampler)
    head = [next(iterator) for _ in range(5)]
    state_dict_saver.save({"data": SamplerCheckpoint(sampler)}, checkpoint_id=tmp_path / "ckpt", no_dist=True)
    fresh = ResumableDistributedSampler(dataset, 1, 0, seed=3)
    state_dict_loader.load({"data": SamplerCheckpoint(fresh)}, checkpoint_id=tmp_path / "ckpt", no_dist=True)
    assert head + list(fresh) == list(ResumableDistributedSampler(dataset, 1, 0, seed=3))

    other = ResumableDistributedSampler(write_tokens(tmp_path / "b", seed=5), 1, 0, seed=3)  # same length
    with pytest.raises(ResumeMismatchError, match="data_fingerprint|dataset"):
        state_dict_loader.load({"data": SamplerCheckpoint(other)}, checkpoint_id=tmp_path / "ckpt", no_dist=True)
    reseeded = ResumableDistributedSampler(dataset, 1, 0, seed=4)
    with pytest.raises(ResumeMismatchError, match="seed"):
        state_dict_loader.load({"data": SamplerCheckpoint(reseeded)}, checkpoint_id=tmp_path / "ckpt", no_dist=True)
    assert list(reseeded) == list(ResumableDistributedSampler(dataset, 1, 0, seed=4))  # refused: not moved


def test_a_plain_dataloader_without_workers_saves_what_it_yielded(tmp_path):
    import torch.utils.data

    dataset = write_tokens(tmp_path / "a")
    sampler = ResumableDistributedSampler(dataset, 1, 0, seed=3)
    loader = torch.utils.data.DataLoader(
        cast("torch.utils.data.Dataset[int]", range(NUM_SAMPLES)), sampler=sampler, batch_size=5, num_workers=0
    )
    iterator = iter(loader)
    head = [int(i) for _ in range(3) for i in next(iterator)]
    state_dict_saver.save({"data": SamplerCheckpoint(loader)}, checkpoint_id=tmp_path / "ckpt", no_dist=True)
    fresh = ResumableDistributedSampler(dataset, 1, 0, seed=3)
    state_dict_loader.load({"data": SamplerCheckpoint(fresh)}, checkpoint_id=tmp_path / "ckpt", no_dist=True)
    assert head + list(fresh) == list(ResumableDistributedSampler(dataset, 1, 0, seed=3))


def test_bad_entries_and_loaders_are_named_errors(tmp_path):
    sampler = ResumableDistributedSampler(write_tokens(tmp_path / "a"), 1, 0)
    with pytest.raises(FormatError, match=STATE_ENTRY):
        SamplerCheckpoint(sampler).load_state_dict({STATE_ENTRY: "{not json"})
    with pytest.raises(FormatError, match="JSON string"):
        SamplerCheckpoint(sampler).load_state_dict({})
    with pytest.raises(ConfigError, match="ResumableDistributedSampler"):
        SamplerCheckpoint(object())
    import torch.utils.data

    # a range is a map-style dataset at run time (__getitem__, __len__); torch's Dataset type does not say so
    dataset = cast("torch.utils.data.Dataset[int]", range(NUM_SAMPLES))
    loader = torch.utils.data.DataLoader(dataset, sampler=sampler, num_workers=2)
    with pytest.raises(ConfigError, match="StatefulDataLoader"):
        SamplerCheckpoint(loader).state_dict()
