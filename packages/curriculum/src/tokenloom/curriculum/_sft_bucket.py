"""An sft record store as a curriculum bucket: its conversations packed whole, labels masked by its loss_mask.

    train/<bucket>/ holding an sft record store (``tokenize --train-type sft``, bin-meta or h5, local or
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
from tokenloom.formats import ConfigError, DataError, RecordStore, open_records
from tokenloom.formats.keyed.store import train_type_of

__all__ = ["SFTBucket", "is_sft_store", "refuse_other_records"]


def is_sft_store(data: Any) -> bool:
    """A bucket's token view (its ``sequence``) read from an sft record store: bin-meta or h5."""
    return {"sequence", "loss_mask"} <= set(getattr(data, "metadata", {}).get("keys", ()))


def refuse_other_records(directory: Path | RemoteDir, name: str) -> None:
    """ConfigError when ``directory`` is a dpo or grpo record store (called when it did not open as tokens)."""
    try:
        keys = set(_open_store(directory).keys)
    except DataError:
        return
    kind = train_type_of(sorted(keys - {"position_ids"}))
    if kind not in (None, "seq", "sft"):
        raise ConfigError(
            f"bucket {name!r} is a {kind} record store ({sorted(keys)}), which a curriculum cannot serve",
            path=directory,
            hint="A bucket holds pretraining tokens or an sft record store (tokenize --train-type sft); "
            f"train on {kind} records with their own loader (open_records)",
        )


def _open_store(directory: Path | RemoteDir) -> RecordStore:
    """The record store of a bucket: a local directory, or a bucket's URL read with its own RemoteOptions."""
    if isinstance(directory, RemoteDir):
        return open_records(directory.url, remote=directory.remote)  # store.path: the URL, never a local view
    return open_records(directory)


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
