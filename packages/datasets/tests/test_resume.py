"""state_dict / load_state_dict on every dataset: JSON round trip, ResumeMismatchError on anything else."""

import json
import pickle

import numpy as np
import pytest
from torch.utils.data import Dataset

from tokenloom.datasets import (
    ArrayStore,
    DatasetFactory,
    MemoryMappedDataset,
    MixtureDataset,
    PackedDocumentDataset,
    check_state,
)
from tokenloom.formats import ConfigError, ResumeMismatchError, open_writer


def build_all(native, tmp_path, *, seq_len):
    data = native([[1, 2, 3, 0], [4, 5, 0], [6, 7, 8, 9, 0]] * 3, eos_id=0)
    store = ArrayStore({"sequence": np.arange(1, 40), "loss_mask": np.ones(39, dtype=np.uint8)})
    windows = MemoryMappedDataset(data, seq_len=seq_len)
    return {
        "windows": windows,
        "packed": PackedDocumentDataset(data, seq_len + 2, plan_cache_dir=tmp_path / "c"),
        "keyed": DatasetFactory.load("sft", store, window_size=seq_len),
        "mixture": MixtureDataset([windows, windows], [0.5, 0.5], seed=1),
    }


@pytest.mark.parametrize("kind", ["windows", "packed", "keyed", "mixture"])
def test_state_round_trips_through_json_and_guards_the_configuration(native, tmp_path, kind):
    mine = build_all(native, tmp_path, seq_len=4)[kind]
    other = build_all(native, tmp_path, seq_len=5)[kind]
    state = json.loads(json.dumps(mine.state_dict()))  # plain JSON types only
    mine.load_state_dict(state)
    build_all(native, tmp_path, seq_len=4)[kind].load_state_dict(state)  # an identical rebuild accepts it
    with pytest.raises(ResumeMismatchError, match="fingerprint"):
        other.load_state_dict(state)
    for garbage in ({}, None, [state], {"fingerprint": None}):
        with pytest.raises(ResumeMismatchError):
            mine.load_state_dict(garbage)


def test_check_state_names_the_owner_and_both_fingerprints():
    with pytest.raises(ResumeMismatchError, match=r"Thing state was saved for fingerprint 'a'.*'b'"):
        check_state({"fingerprint": "a"}, fingerprint="b", owner="Thing")


def test_mixture_bad_sources_and_lengths(native):
    windows = MemoryMappedDataset(native([list(range(1, 20))], eos_id=None), seq_len=4)

    class Empty(Dataset):
        def __len__(self):
            return 0

        def __getitem__(self, index):
            raise IndexError(index)

    with pytest.raises(ConfigError, match="empty"):
        MixtureDataset([windows, Empty()], [0.5, 0.5], seed=0)
    MixtureDataset([windows, Empty()], [1.0, 0.0], seed=0)  # an empty source of weight 0 is fine
    with pytest.raises(ConfigError, match="num_samples"):
        MixtureDataset([windows], [1.0], seed=0, num_samples=0)
    with pytest.raises(ConfigError, match="epoch"):
        MixtureDataset([windows], [1.0], seed=0).set_epoch(-1)


@pytest.mark.parametrize(("store_format", "name"), [("h5", "s.h5"), ("bin-meta", "s")])
def test_keyed_datasets_pickle_without_their_data(tmp_path, store_format, name):
    pytest.importorskip("h5py")
    sizes = []
    for length in (100, 200_000):
        path = tmp_path / f"{length}-{name}"
        with open_writer(path, format=store_format, dtype="uint16", vocab_size=1000, train_type="sft") as writer:
            writer.add_keyed({"sequence": np.arange(length) % 999, "loss_mask": np.ones(length, dtype=np.uint8)})
        ds = DatasetFactory.load("sft", path, window_size=8)
        ds[0]  # open the files in this process
        blob = pickle.dumps(ds)
        sizes.append(len(blob))
        assert pickle.loads(blob)[3]["labels"].tolist() == ds[3]["labels"].tolist()
    assert abs(sizes[1] - sizes[0]) < 200  # 600 kB of keys stay on disk
