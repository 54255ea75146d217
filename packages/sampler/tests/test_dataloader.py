"""Resume under torchdata's StatefulDataLoader (also across worker counts) and a plain DataLoader."""

import pytest
from torch.utils.data import DataLoader, Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from tokenloom.formats.errors import ConfigError
from tokenloom.sampler import ResumableDistributedSampler, sampler_state_from_loader

N, BATCH, STEPS_BEFORE_CRASH = 103, 4, 7

pytestmark = [
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
    pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes:UserWarning"),
]


class Indices(Dataset[int]):
    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> int:
        return index


def make(num_workers: int, world: int = 1, rank: int = 0, **loader_kwargs):
    sampler = ResumableDistributedSampler(N, world, rank, seed=5)
    loader = StatefulDataLoader(Indices(), batch_size=BATCH, sampler=sampler, num_workers=num_workers, **loader_kwargs)
    return sampler, loader


def flatten(batches) -> list[int]:
    return [int(i) for batch in batches for i in batch]


def reference(world: int = 1, rank: int = 0) -> list[int]:
    return list(ResumableDistributedSampler(N, world, rank, seed=5))


def run_until_crash(num_workers: int):
    sampler, loader = make(num_workers)
    it = iter(loader)
    seen = flatten(next(it) for _ in range(STEPS_BEFORE_CRASH))
    state = loader.state_dict()
    drawn_ahead = sampler.consumed
    del it
    return seen, state, drawn_ahead


@pytest.mark.parametrize("resume_workers", [0, 3])
def test_resume_from_two_workers_on_another_worker_count_continues_exactly(resume_workers: int) -> None:
    seen, loader_state, drawn_ahead = run_until_crash(num_workers=2)
    state = sampler_state_from_loader(loader_state)
    assert state["consumed"] == STEPS_BEFORE_CRASH * BATCH
    assert drawn_ahead > state["consumed"]  # the live sampler ran ahead: prefetching

    sampler, loader = make(resume_workers)
    sampler.load_state_dict(state)
    rest = flatten(loader)
    assert seen + rest == reference()
    assert flatten(loader) == list(ResumableDistributedSampler(N, 1, 0, seed=5, start_epoch=1))


def test_resume_with_the_same_worker_count_through_the_loader_state() -> None:
    seen, loader_state, _ = run_until_crash(num_workers=2)
    _, loader = make(2)
    loader.load_state_dict(loader_state)
    assert seen + flatten(loader) == reference()


def test_single_process_loader_state_resumes_on_another_world_size() -> None:
    seen, loader_state, _ = run_until_crash(num_workers=0)
    state = sampler_state_from_loader(loader_state)
    assert state["consumed"] == STEPS_BEFORE_CRASH * BATCH
    rest = []
    for rank in range(2):
        sampler, loader = make(0, world=2, rank=rank)
        sampler.load_state_dict(state)
        rest.append(flatten(loader))
    merged = [i for pair in zip(*rest, strict=True) for i in pair]
    assert (seen + merged)[:N] == reference()


def test_a_loader_state_between_snapshots_is_refused() -> None:
    _, loader = make(2, snapshot_every_n_steps=4)
    it = iter(loader)
    for _ in range(5):
        next(it)
    with pytest.raises(ConfigError, match="snapshot_every_n_steps=1"):
        sampler_state_from_loader(loader.state_dict())


def test_a_loader_without_this_sampler_is_refused() -> None:
    loader = StatefulDataLoader(Indices(), batch_size=2)
    with pytest.raises(ConfigError, match="no ResumableDistributedSampler state"):
        sampler_state_from_loader(loader.state_dict())


def test_plain_dataloader_resumes_with_start_iter() -> None:
    first = DataLoader(Indices(), batch_size=BATCH, sampler=ResumableDistributedSampler(N, 2, 1, seed=5))
    it = iter(first)
    seen = flatten(next(it) for _ in range(3))
    resumed = ResumableDistributedSampler(N, 2, 1, seed=5, start_iter=3 * BATCH)
    assert seen + flatten(DataLoader(Indices(), batch_size=BATCH, sampler=resumed)) == reference(2, 1)
