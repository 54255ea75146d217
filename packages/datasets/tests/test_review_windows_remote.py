"""Review of issue 36's datasets folds: MemoryMappedDataset's batch gathers plain and packed windows in one loop
(WindowIndex.plain), and check_remote is the one refusal of remote options for local data."""

from __future__ import annotations

import pytest
import torch

from tokenloom.datasets import MemoryMappedDataset
from tokenloom.datasets._stream import open_data
from tokenloom.formats import ConfigError, RemoteOptions, open_dataset

DOCS = [[1, 2, 3, 0], [4, 5, 0], [6, 7, 8, 9, 10, 11, 0], [12, 0]] * 9


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"stride": 3},
        {"cross_shard": True},
        {"pack_sequences": True, "position_ids": True, "cu_seqlens": True},
        {"pack_sequences": "gpt-simple"},
        {"pack_sequences": True, "stride": 3},
    ],
)
@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_a_batch_is_its_samples_stacked(native, options: dict, dtype: str) -> None:
    ds = MemoryMappedDataset(native(DOCS, eos_id=0, dtype=dtype), seq_len=5, **options)
    indices = [len(ds) - 1, 0, 3, 1, 3]
    batch = ds.__getitems__(indices).batched
    samples = [ds[i] for i in indices]
    assert set(batch) >= set(samples[0])
    for key in ("input_ids", "labels", "position_ids"):
        if key in samples[0]:
            expected = torch.stack([s[key] for s in samples]).to(torch.int64)
            assert torch.equal(batch[key].to(torch.int64), expected), (key, options)
    assert batch["input_ids"].shape == (len(indices), 5)


def test_remote_options_for_local_data_are_refused_naming_what(native, tmp_path) -> None:
    native(DOCS, eos_id=0)  # written to tmp_path/ds0 and opened
    path = tmp_path / "ds0"
    remote = RemoteOptions.from_keywords(storage_options={})
    with pytest.raises(ConfigError, match=r"not to the local path") as caught:
        open_data(path, remote=remote)
    assert str(path) in str(caught.value) and caught.value.field == "remote"
    with pytest.raises(ConfigError, match="not to an open dataset"):
        open_data(open_dataset(path), remote=remote)
    with pytest.raises(ConfigError, match="not to the local path"):
        MemoryMappedDataset(path, seq_len=4, remote=remote)
    assert len(open_data(path)) == len(open_dataset(path))
