"""Record-mode dpo and grpo (AstrAI's current DPODataset / GRPODataset): one sample per record.

A record is an independent training unit: no windowing, no stride, nothing
joined across records. Sample ``i`` is record ``i`` of a
:func:`tokenloom.formats.open_records` store, with AstrAI's keys and dtypes:

- dpo: ``chosen``, ``rejected`` (int64), ``chosen_mask``, ``rejected_mask`` (bool,
  aligned with the tokens, as AstrAI's masks are), each as long as the record;
- grpo: ``prompts`` (int64), ``responses`` (a list of G int64 tensors), ``masks``
  (a list of G bool tensors), ``rewards`` (float32, G values).

Lengths vary per sample, so batch them with a padding collate (AstrAI's
``dpo_collate_fn`` / ``grpo_collate_fn`` take these dicts as they are).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from tokenloom.datasets._state import FingerprintState, settings_fingerprint
from tokenloom.datasets._stream import check_remote
from tokenloom.formats import TRAIN_TYPE_KEYS, ConfigError, MissingKeyError, RecordStore, RemoteOptions, open_records

__all__ = ["RecordDataset"]

_BOOL_KEYS = frozenset({"chosen_mask", "rejected_mask", "masks"})


def _tensor(key: str, values: np.ndarray) -> torch.Tensor:
    # copies: a record is small, and torch wants writable memory (the maps are read-only)
    if key == "rewards":
        return torch.from_numpy(np.array(values, dtype=np.float32))
    if key in _BOOL_KEYS:
        return torch.from_numpy(np.asarray(values) != 0)
    return torch.from_numpy(np.array(values, dtype=np.int64))


class RecordDataset(FingerprintState, Dataset[dict[str, Any]]):
    """dpo or grpo records of a record store (see the module docstring)."""

    def __init__(
        self, store: RecordStore | str | os.PathLike[str], train_type: str, *, remote: RemoteOptions | None = None
    ) -> None:
        """``store``: an open record store, or its path or URL (``remote``: how a URL is read, a RemoteOptions;
        only for a URL, kept by the store as ``store.remote`` and pickled with it)."""
        check_remote(store, remote, in_hand="a RecordStore")
        if train_type not in ("dpo", "grpo"):
            raise ConfigError(
                f"record mode serves dpo and grpo, not {train_type!r}",
                field="train_type",
                hint="seq and sft are streams: pass seq_len",
            )
        self.store = store if isinstance(store, RecordStore) else open_records(store, remote=remote)
        self.train_type = train_type
        self.keys = TRAIN_TYPE_KEYS[train_type]
        missing = [key for key in self.keys if key not in self.store.keys]
        streams = [key for key in missing if key in self.store.stream_keys]
        if streams:
            raise MissingKeyError(
                f"training type {train_type!r} reads {streams} as records, but meta.json gives "
                f"{'it' if len(streams) == 1 else 'them'} no offsets (a stream key)",
                path=self.store.path,
                field=streams[0],
                hint=f"Write the store with AstrAI's save_bin(path, tensors, record_keys={list(self.keys)})",
            )
        if missing:
            raise MissingKeyError(
                f"training type {train_type!r} needs keys {list(self.keys)}, missing {missing} "
                f"(the store has {self.store.keys})",
                path=self.store.path,
            )
        self._fingerprint = settings_fingerprint(
            store=str(self.store.path), records=len(self.store), train_type=train_type, mode="records"
        )

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if index < 0:
            index += len(self)
        raw = self.store.record(index, self.keys)
        out: dict[str, Any] = {}
        for key, value in raw.items():
            if isinstance(value, list):
                out[key] = [_tensor(key, v) for v in value]
            else:
                out[key] = _tensor(key, value)  # type: ignore[arg-type]
        return out
