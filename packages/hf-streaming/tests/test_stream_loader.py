"""stream_loader: the same batches and states as StatefulDataLoader(dataset, batch_size), batches cut by the workers."""

from __future__ import annotations

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from tokenloom.formats import ConfigError
from tokenloom.hf_streaming import StreamingHuggingFaceDataset, merge_rank_states, stream_loader


def _dataset(corpus, tokenizer_dir, **extra) -> StreamingHuggingFaceDataset:
    kwargs = {"seed": 7, "shuffle_buffer_size": 8, "encode_batch_size": 5, **extra}
    return StreamingHuggingFaceDataset("json", "train", "text", 24, str(tokenizer_dir), data_files=corpus, **kwargs)


def _same(left: list[dict], right: list[dict]) -> None:
    assert len(left) == len(right)
    for a, b in zip(left, right, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(
    "extra", [{}, {"drop_remainder": True}, {"with_provenance": True, "pack_sequences": True, "position_ids": True}]
)
def test_same_batches_as_the_per_sample_loader(corpus, tokenizer_dir, workers, extra):
    expected = list(StatefulDataLoader(_dataset(corpus, tokenizer_dir, **extra), batch_size=3, num_workers=workers))
    got = list(stream_loader(_dataset(corpus, tokenizer_dir, **extra), batch_size=3, num_workers=workers))
    _same(expected, got)
    if not extra:  # with this corpus, a worker's last batch holds fewer windows: what is left of its pass
        assert any(len(batch["input_ids"]) < 3 for batch in got)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_pass_is_exact_and_states_merge(corpus, tokenizer_dir, workers):
    whole = list(stream_loader(_dataset(corpus, tokenizer_dir), batch_size=4, num_workers=workers))
    loader = stream_loader(_dataset(corpus, tokenizer_dir), batch_size=4, num_workers=workers)
    batches = iter(loader)
    head = [next(batches) for _ in range(5)]
    state = loader.state_dict()
    resumed = stream_loader(_dataset(corpus, tokenizer_dir), batch_size=4, num_workers=workers)
    resumed.load_state_dict(state)
    _same(whole, head + list(resumed))
    merged = merge_rank_states([state])  # the slot states stand at the batch boundaries: any topology can load them
    assert merged["kind"] == "merged"


def test_batch_size_and_dataset_are_checked(corpus, tokenizer_dir):
    with pytest.raises(ConfigError, match="batch_size"):
        stream_loader(_dataset(corpus, tokenizer_dir), batch_size=0)
    with pytest.raises(ConfigError, match="StreamingHuggingFaceDataset, not a list"):
        stream_loader([1, 2, 3], batch_size=2)


def test_a_second_loader_with_another_batch_size_is_refused(corpus, tokenizer_dir):
    """The batch size lives on the dataset: a second size silently changed the first loader's batches."""
    ds = _dataset(corpus, tokenizer_dir)
    first = stream_loader(ds, batch_size=4)
    assert stream_loader(ds, batch_size=4) is not first  # the same size again (a loader rebuilt): allowed
    with pytest.raises(ConfigError, match="already yields batches of 4"):
        stream_loader(ds, batch_size=2)
    assert len(next(iter(first))["input_ids"]) == 4


def test_the_objects_alive_are_frozen_only_when_asked_with_workers(corpus, tokenizer_dir):
    import gc

    gc.unfreeze()
    try:
        stream_loader(_dataset(corpus, tokenizer_dir), batch_size=2, num_workers=0, freeze_gc=True)
        stream_loader(_dataset(corpus, tokenizer_dir), batch_size=2, num_workers=2)
        assert gc.get_freeze_count() == 0
        stream_loader(_dataset(corpus, tokenizer_dir), batch_size=2, num_workers=2, freeze_gc=True)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
