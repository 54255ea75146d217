"""Exactly-once oracle: real DataLoader workers, world sizes 1 -> 2 -> 4 -> 3, saves around phase boundaries."""

from __future__ import annotations

import numpy as np
import pytest
from curriculum_helpers import SEQ_LEN, WINDOW
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from tokenloom.curriculum import BucketExhausted, CurriculumConfig, CurriculumDataset, Phase
from tokenloom.datasets import collate
from tokenloom.sampler import ResumableDistributedSampler, sampler_state_from_loader

SEED = 1234
TOPOLOGIES = [(1, 0), (2, 2), (4, 3), (3, 1)]  # (world size, num_workers), cycled


def _config(root, policy="renormalise"):
    phases = (
        Phase(duration_tokens=3000, mix={"a": 1, "b": 1}),
        Phase(duration_tokens=4000, mix={"a": 0.2, "b": 0.3, "c": 0.5}),
        Phase(duration_tokens=4000, mix={"b": 0.6, "c": 0.4}),
    )
    return CurriculumConfig(path=root, seq_len=SEQ_LEN, packing=False, curriculum=phases, bucket_exhaustion=policy)


def _identities(batch):
    return list(zip(batch["bucket"].tolist(), (batch["input_ids"][:, 0] // WINDOW).tolist(), strict=True))


def _loaders(ds, world, workers, state):
    loaders = []
    for rank in range(world):
        sampler = ResumableDistributedSampler(ds, num_replicas=world, rank=rank, shuffle=False, seed=SEED, pad=False)
        if state is not None:
            sampler.load_state_dict(state)
        loader = StatefulDataLoader(
            ds, sampler=sampler, batch_size=1, num_workers=workers, collate_fn=collate, timeout=120 if workers else 0
        )
        loaders.append(loader)
    return loaders


def _segment(ds, world, workers, state, target, seen, *, final=False):
    """Run lock-step until consumed reaches the largest position <= target (at least one step); save."""
    start = 0 if state is None else int(state["consumed"])
    steps = max(1, (target - start) // world)
    loaders = _loaders(ds, world, workers, state)
    iterators = [iter(loader) for loader in loaders]
    taken = [0] * world
    for _ in range(steps):
        for rank, iterator in enumerate(iterators):
            batch = next(iterator, None)
            if batch is None:
                continue
            for identity in _identities(batch):
                position = start + rank + world * taken[rank]
                assert position not in seen, f"position {position} consumed twice"
                seen[position] = identity
                taken[rank] += 1
    if final:  # the exact tail (pad=False): ranks end one sample apart, nothing to save
        assert all(next(iterator, None) is None for iterator in iterators)
        return None
    states = [sampler_state_from_loader(loader.state_dict()) for loader in loaders]
    assert all(s == states[0] for s in states), states
    del iterators, loaders
    return states[0]


def test_exactly_once_in_the_uninterrupted_order_across_topologies(corpus):
    ds = CurriculumDataset(_config(corpus), seed=SEED)
    reference_loader = DataLoader(
        ds, sampler=ResumableDistributedSampler(ds, num_replicas=1, rank=0, shuffle=False, seed=SEED),
        batch_size=7, collate_fn=collate,
    )  # fmt: skip
    reference = [identity for batch in reference_loader for identity in _identities(batch)]
    _, bucket, index = ds.locate(np.arange(len(ds)))
    assert reference == list(zip(bucket.tolist(), index.tolist(), strict=True))
    assert len(set(reference)) == len(ds)

    (_, p1), (_, p2), _ = ds.schedule.phase_bounds
    drain = ds.schedule.drains[0].position
    assert p1 < p2 < drain < len(ds)
    targets = [p1, p1 + 2, p2 - 1, p2 + 1, drain, drain + 3, len(ds) - 5]
    seen: dict[int, tuple[int, int]] = {}
    state = None
    saves = []
    for number, target in enumerate(targets):
        world, workers = TOPOLOGIES[number % len(TOPOLOGIES)]
        state = _segment(ds, world, workers, state, target, seen)
        assert state is not None
        saves.append(state["consumed"])
    world, workers = TOPOLOGIES[len(targets) % len(TOPOLOGIES)]
    _segment(ds, world, workers, state, len(ds) + world, seen, final=True)  # to the end
    assert sorted(seen) == list(range(len(ds))), "something was skipped"
    assert [seen[p] for p in range(len(ds))] == reference
    offsets = {s - b for s in saves for b in (p1, p2, drain) if abs(s - b) <= 4}
    assert min(offsets) < 0 and 0 in offsets and max(offsets) > 0  # saves before, at and after boundaries


def test_the_drain_position_is_the_same_on_every_topology(corpus):
    ds = CurriculumDataset(_config(corpus, policy="halt"), seed=SEED)
    halts = []
    for world, workers in TOPOLOGIES:
        loaders = _loaders(ds, world, workers, None)
        iterators = [iter(loader) for loader in loaders]
        step = 0
        with pytest.raises(BucketExhausted) as caught:
            while True:
                for iterator in iterators:
                    next(iterator)
                step += 1
        assert caught.value.bucket == "b"
        # the first rank to ask for a sample at or past the drain is at the same global position
        halts.append((step, world, caught.value.position))
        del iterators, loaders
    assert ds.halt is not None
    positions = {position for _, _, position in halts}
    assert positions == {ds.halt.position}
    for step, world, _ in halts:
        assert step * world <= ds.halt_position < (step + 1) * world


def _resume_schedule(ds, targets, topologies, reopen=None) -> dict[int, tuple[int, int]]:
    """Run ``ds`` to each target past the last in turn, each segment on the next topology (on ``reopen(state)`` if
    given, a dataset resumed from the state), then to its end on 3 ranks of 1 worker: each position's sample."""
    seen: dict[int, tuple[int, int]] = {}
    state = None
    for number, target in enumerate(targets):
        world, workers = topologies[number % len(topologies)]
        if state is not None and target <= state["consumed"]:
            continue
        state = _segment(ds if reopen is None else reopen(state), world, workers, state, int(target), seen)
    _segment(ds, 3, 1, state, len(ds) + 3, seen, final=True)
    return seen


@pytest.mark.parametrize("seed", [5])
def test_exactly_once_on_a_random_resume_schedule(corpus, seed):
    ds = CurriculumDataset(_config(corpus), seed=SEED)
    expected = list(zip(*[a.tolist() for a in ds.locate(np.arange(len(ds)))[1:]], strict=True))
    rng = np.random.default_rng(seed)
    targets = sorted(rng.choice(np.arange(10, len(ds) - 10), size=4, replace=False).tolist())
    seen = _resume_schedule(ds, targets, TOPOLOGIES)
    assert [seen[p] for p in range(len(ds))] == expected
