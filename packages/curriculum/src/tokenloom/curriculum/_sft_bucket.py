"""An sft record store as a curriculum bucket: its conversations packed whole, labels masked by its loss_mask.

    train/<bucket>/ holding meta.json + sequence.bin + loss_mask.bin (``tokenize --train-type sft``, local or
    in a bucket) -> PackedSFTDataset (best-fit decreasing bins of seq_len, positions reset per conversation,
    labels -100 where the loss mask is 0 and across conversations) -> the curriculum's packed samples

A pretraining bucket beside it serves the same keys (``input_ids``, ``labels``, ``doc_ids``, ``position_ids``),
so one batch mixes both; ``cu_seqlens`` (only the sft view has it) is left out of the mixed batch. Budget units:
``input_tokens`` are a sample's conversation tokens (no padding), ``loss_tokens`` its trained labels. Without
``packing: true`` an sft bucket is a ConfigError: fixed windows would cut conversations and drop their masks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from tokenloom.curriculum._config import BudgetUnit
from tokenloom.curriculum._remote_dir import RemoteDir
from tokenloom.formats import ConfigError, RecordStore, open_records

__all__ = ["SFTBucket", "is_sft_store"]


def is_sft_store(directory: Path | RemoteDir) -> bool:
    """A bucket directory holding an sft record store (meta.json beside sequence.bin and loss_mask.bin)."""
    names = {path.name for path in directory.iterdir()}
    return {"meta.json", "sequence.bin", "loss_mask.bin"} <= names


def _open_store(directory: Path | RemoteDir) -> RecordStore:
    if not isinstance(directory, RemoteDir):
        return open_records(directory)
    from tokenloom.formats.remote.opener import read_remote  # the bucket's own store options and cache

    store = read_remote(directory.url, open_records, remote=directory.remote)
    store.path = directory.url  # a URL, never the node's local view (part of the packed view's fingerprint)
    return store


class SFTBucket:
    """The packed samples of an sft record store, with what the curriculum asks of a bucket's dataset."""

    def __init__(self, directory: Path | RemoteDir, name: str, data: Any, seq_len: int, *, packing: bool) -> None:
        if not packing:
            raise ConfigError(
                f"bucket {name!r} is an sft record store, and fixed windows would cut its conversations and drop "
                "their loss masks",
                path=directory,
                field="packing",
                hint="Set packing: true (sft buckets are packed whole, as PackedSFTDataset; pretraining buckets "
                "beside them are bin-packed documents)",
            )
        from tokenloom.datasets import PackedSFTDataset  # torch: only a curriculum with an sft bucket needs it

        self.packed = PackedSFTDataset(_open_store(directory), seq_len)  # its defaults: bucket_options are the
        self.name = name  # pretraining buckets' PackedDocumentDataset options
        self.dataset = data  # the store's token view (sequence): dtype, EOS id, sizes, objects in storage
        self.seq_len = seq_len
        self._budgets: dict[BudgetUnit, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.packed)

    def fingerprint(self) -> str:
        return self.packed.fingerprint()

    def __getitems__(self, indices: list[int]) -> Any:
        batch = self.packed.__getitems__(indices)
        batch.batched.pop("cu_seqlens", None)  # the keys every packed bucket serves (see the module docstring)
        return batch

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {key: value[0] for key, value in self.__getitems__([index]).batched.items()}

    def data_objects(self) -> dict[str, str]:
        """``{URL: "size:ETag"}`` of the store's objects in storage ({} on disk); saved in states."""
        return dict(getattr(self.dataset, "metadata", {}).get("remote_objects", {}))

    def budget(self, unit: BudgetUnit | str) -> np.ndarray:
        """Budget tokens of every sample: its conversation tokens, or (loss_tokens) its trained labels."""
        unit = BudgetUnit(unit)
        if unit not in self._budgets:
            self._budgets[unit] = self._budget(unit)
        return self._budgets[unit]

    def _budget(self, unit: BudgetUnit) -> np.ndarray:
        store = self.packed.store
        per_record = []
        for part in store.parts:
            offsets = np.asarray(part.offsets["sequence"], dtype=np.int64)
            if unit is BudgetUnit.LOSS_TOKENS:  # label p is token p + 1 where its mask is 1
                trained = np.concatenate([[0], np.cumsum(np.asarray(part.array("loss_mask"), dtype=np.int64))])
                first = np.minimum(offsets[:-1] + 1, offsets[1:])
                per_record.append(trained[offsets[1:]] - trained[first])
            else:
                per_record.append(np.diff(offsets))
        lengths = np.concatenate(per_record)
        return np.asarray([int(lengths[self.packed.conversations(i)].sum()) for i in range(len(self))], np.int64)

    def remote_caches(self) -> list[Any]:
        return []  # read through the block cache as used; the curriculum's prefetch does not plan its blocks

    def blocks_of(self, indices: list[int]) -> list[list[tuple[Any, Any, int]]]:
        return [[] for _ in indices]

    def __repr__(self) -> str:
        return f"SFTBucket({self.name!r}, {self.packed!r}, path={os.fspath(self.packed.store.path)!r})"
