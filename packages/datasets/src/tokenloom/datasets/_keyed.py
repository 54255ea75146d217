"""Training types over keyed stores (AstrAI's DatasetFactory): seq, sft, dpo, grpo.

A keyed store holds, per key, one flat array over the same positions
(``sequence``, ``loss_mask``, ``chosen``, ...). Sample ``i`` reads positions
``[i * stride, i * stride + seq_len + 1)`` for the shifted types (seq, sft,
dpo: inputs are the first ``seq_len``, labels the last) and
``[i * stride, i * stride + seq_len)`` for grpo, whose loss is computed by
the trainer from prompts, responses, masks and rewards as stored.
(``seq_len`` is what AstrAI calls ``window_size``.)

sft also returns ``position_ids`` (aligned with ``input_ids``): the store's
``position_ids`` key where it has one (AstrAI's SFT stores), else ``0 ..
seq_len - 1`` per sample (a store without that key records no record
boundaries a reset could follow). dpo masks are aligned with the labels by
default (``mask_alignment="labels"``: ``chosen_mask[t]`` says whether
``chosen_labels[t]`` counts) or, as AstrAI does, with the inputs
(``mask_alignment="inputs"``: ``chosen_mask[t]`` says whether token
``chosen_input_ids[t]`` counts).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, Protocol, overload, runtime_checkable

import numpy as np
import torch
from torch.utils.data import Dataset

from tokenloom.datasets._batch import SampleBatch, stack_samples
from tokenloom.datasets._packing_mode import check_choice
from tokenloom.datasets._records import RecordDataset
from tokenloom.datasets._sample import IGNORE_INDEX
from tokenloom.datasets._state import FingerprintState, settings_fingerprint
from tokenloom.datasets._stream import check_remote
from tokenloom.datasets._windows import check_positive
from tokenloom.formats import (
    OPTIONAL_TRAIN_TYPE_KEYS,
    TRAIN_TYPE_KEYS,
    ConfigError,
    DataError,
    MissingKeyError,
    RecordStore,
    RemoteOptions,
    ShapeMismatchError,
    open_records,
    open_store,
)
from tokenloom.formats.keyed import RECORD_FORMATS

__all__ = ["ArrayStore", "DatasetFactory", "KeyedDataset", "KeyedSource", "MaskAlignment", "TrainType"]

log = logging.getLogger("tokenloom.datasets")


@runtime_checkable
class KeyedSource(Protocol):
    """What the training types need from a store: its length and a range fetch over named keys."""

    def __len__(self) -> int: ...

    def fetch(self, begin: int, end: int, keys: Sequence[str]) -> Mapping[str, np.ndarray]: ...


class TrainType(StrEnum):
    SEQ = "seq"
    SFT = "sft"
    DPO = "dpo"
    GRPO = "grpo"


class MaskAlignment(StrEnum):
    """Which positions a dpo ``*_mask`` describes (see the module docstring)."""

    LABELS = "labels"  # tokenloom's default: mask[t] goes with labels[t] (token t + 1)
    INPUTS = "inputs"  # AstrAI: mask[t] goes with input_ids[t]


class ArrayStore:
    """An in-memory keyed store over equal-length 1-D arrays (tests, small data, conversions)."""

    def __init__(self, arrays: Mapping[str, Any], *, name: str = "<memory>") -> None:
        self.arrays = {key: np.asarray(value) for key, value in arrays.items()}
        self.name = name
        lengths = {key: len(value) for key, value in self.arrays.items()}
        if len(set(lengths.values())) > 1:
            raise ShapeMismatchError(f"keys have different lengths {lengths}, expected one length", path=name)
        self._length = next(iter(lengths.values()), 0)

    @property
    def keys(self) -> list[str]:
        return sorted(self.arrays)

    def __len__(self) -> int:
        return self._length

    def fetch(self, begin: int, end: int, keys: Sequence[str]) -> dict[str, np.ndarray]:
        missing = [key for key in keys if key not in self.arrays]
        if missing:
            raise MissingKeyError(f"keys {missing} are absent, the store has {sorted(self.arrays)}", path=self.name)
        return {key: self.arrays[key][begin:end] for key in keys}


def _check_store(store: KeyedSource, keys: Sequence[str], where: str) -> int:
    """The store's length, after checking every key of the type reaches it."""
    length = len(store)
    if length == 0:
        return 0
    tail = store.fetch(length - 1, length, keys)
    short = {key: len(tail.get(key, ())) for key in keys if len(tail.get(key, ())) != 1}
    if short:
        raise ShapeMismatchError(
            f"keys {sorted(short)} are shorter than the store's {length} positions", path=where, field=sorted(short)[0]
        )
    return length


class KeyedDataset(FingerprintState, Dataset[dict[str, torch.Tensor]]):
    """Windows over a keyed store, shaped by training type (see the README for every output key)."""

    def __init__(
        self,
        store: KeyedSource,
        train_type: TrainType | str,
        seq_len: int | None = None,
        stride: int | None = None,
        *,
        mask_alignment: MaskAlignment | str = MaskAlignment.LABELS,
    ) -> None:
        if seq_len is None:
            raise ConfigError("KeyedDataset needs seq_len (tokens per sample)", field="seq_len")
        self.train_type = check_choice(TrainType, train_type, "train_type")
        self.mask_alignment = check_choice(MaskAlignment, mask_alignment, "mask_alignment")
        self.seq_len = check_positive(seq_len, "seq_len")
        self.stride = check_positive(stride if stride is not None else seq_len, "stride")
        self.store = store
        present = set(getattr(store, "keys", ()) or ())
        optional = [k for k in OPTIONAL_TRAIN_TYPE_KEYS.get(self.train_type.value, ()) if k in present]
        self.keys = (*TRAIN_TYPE_KEYS[self.train_type.value], *optional)
        where = str(getattr(store, "name", None) or getattr(store, "path", None) or type(store).__name__)
        length = _check_store(store, self.keys, where)
        self.span = self.seq_len + (0 if self.train_type is TrainType.GRPO else 1)
        if length < self.span:
            raise ConfigError(
                f"the store has {length} positions, shorter than one window of {self.span}",
                path=where,
                field="seq_len",
                hint="Use a smaller seq_len",
            )
        self._length = (length - self.span) // self.stride + 1
        self._fingerprint = settings_fingerprint(
            store=where,
            length=length,
            train_type=self.train_type.value,
            window=self.seq_len,  # the fingerprint's key stays "window": saved states keep matching
            stride=self.stride,
            keys=list(self.keys),
            mask_alignment=self.mask_alignment.value,
        )

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError(f"sample {index} out of range for {self._length} samples")
        begin = index * self.stride
        raw = self.store.fetch(begin, begin + self.span, self.keys)
        lengths = {key: len(raw[key]) for key in self.keys}
        if set(lengths.values()) != {self.span}:
            raise ShapeMismatchError(f"window {index} fetched lengths {lengths}, expected {self.span} for every key")
        return {key: torch.from_numpy(np.ascontiguousarray(value)) for key, value in self._shape(raw).items()}

    def __getitems__(self, indices: Sequence[int]) -> SampleBatch:
        return SampleBatch(stack_samples([self[i] for i in indices]) or {})

    def _shape(self, raw: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.train_type is TrainType.GRPO:
            return {
                "prompts": raw["prompts"].astype(np.int64),
                "responses": raw["responses"].astype(np.int64),
                "masks": raw["masks"].astype(np.int64),
                "rewards": raw["rewards"].astype(np.float32),
            }
        if self.train_type is TrainType.SEQ:
            return _shifted(raw["sequence"], None)
        if self.train_type is TrainType.SFT:
            sample = _shifted(raw["sequence"], raw["loss_mask"])
            if "position_ids" in raw:
                positions = raw["position_ids"][:-1].astype(np.int64)
            else:
                positions = np.arange(self.seq_len, dtype=np.int64)
            return {
                "input_ids": sample["input_ids"],
                "labels": sample["labels"],
                "loss_mask": sample["mask"],
                "position_ids": positions,
            }
        out: dict[str, np.ndarray] = {}
        for side in ("chosen", "rejected"):
            sample = _shifted(raw[side], raw[f"{side}_mask"])
            out[f"{side}_input_ids"] = sample["input_ids"]
            out[f"{side}_labels"] = sample["labels"]
            if self.mask_alignment is MaskAlignment.INPUTS:
                out[f"{side}_mask"] = raw[f"{side}_mask"][:-1].astype(np.int64)
            else:
                out[f"{side}_mask"] = sample["mask"]
        return out


def _shifted(tokens: np.ndarray, mask: np.ndarray | None) -> dict[str, np.ndarray]:
    window = tokens.astype(np.int64)
    labels = window[1:].copy()
    out = {"input_ids": window[:-1], "labels": labels}
    if mask is not None:
        label_mask = mask[1:].astype(np.int64)
        labels[label_mask == 0] = IGNORE_INDEX
        out["mask"] = label_mask
    return out


def open_keyed_store(
    path: str | os.PathLike[str] | KeyedSource,
    format: str | None,
    train_type: TrainType,
    *,
    remote: RemoteOptions | None = None,
) -> KeyedSource:
    """A store object as is, or the store at a path or URL (``tokenloom.formats.open_store``, keys checked).

    ``remote`` (a RemoteOptions) applies to a URL (``s3://``, ``gs://``, ``az://``, ``https://``) only: it goes
    to ``open_store``, which reads the store through the remote layer and keeps it as ``store.remote``.
    """
    check_remote(path, remote, in_hand="a store object")
    if isinstance(path, KeyedSource):
        return path
    return open_store(path, format, train_type=train_type.value, remote=remote)


_StorePath = str | os.PathLike[str] | KeyedSource


class DatasetFactory:
    """AstrAI's entry point: ``DatasetFactory.load("sft", "data.h5", seq_len=1024)``.

    AstrAI's own keyword names are the seed's API that users port from: they are accepted without a
    warning, in place of ``path``, ``seq_len`` and ``format`` (passing both spellings is a ConfigError).
    """

    # AstrAI's names: load_path -> path, window_size -> seq_len, storage_type -> format  # old-name

    @overload
    @staticmethod
    def load(
        train_type: TrainType | str,
        path: _StorePath | None,
        seq_len: int,
        stride: int | None = None,
        format: str | None = None,
        *,
        mask_alignment: MaskAlignment | str = MaskAlignment.LABELS,
        remote: RemoteOptions | None = None,
        load_path: _StorePath | None = None,  # old-name: AstrAI's
        storage_type: str | None = None,  # old-name: AstrAI's
    ) -> KeyedDataset: ...

    @overload
    @staticmethod
    def load(
        train_type: TrainType | str,
        path: _StorePath | None = None,
        seq_len: None = None,
        stride: int | None = None,
        format: str | None = None,
        *,
        window_size: int,
        mask_alignment: MaskAlignment | str = MaskAlignment.LABELS,
        remote: RemoteOptions | None = None,
        load_path: _StorePath | None = None,  # old-name: AstrAI's
        storage_type: str | None = None,  # old-name: AstrAI's
    ) -> KeyedDataset: ...

    @overload
    @staticmethod
    def load(
        train_type: TrainType | str,
        path: str | os.PathLike[str] | RecordStore | None = None,
        seq_len: None = None,
        stride: None = None,
        format: None = None,
        *,
        mask_alignment: MaskAlignment | str = MaskAlignment.LABELS,
        remote: RemoteOptions | None = None,
        load_path: str | os.PathLike[str] | RecordStore | None = None,  # old-name: AstrAI's
        window_size: None = None,
        storage_type: None = None,  # old-name: AstrAI's
    ) -> RecordDataset: ...

    @staticmethod
    def load(
        train_type: TrainType | str,
        path: _StorePath | RecordStore | None = None,
        seq_len: int | None = None,
        stride: int | None = None,
        format: str | None = None,
        *,
        mask_alignment: MaskAlignment | str = MaskAlignment.LABELS,
        remote: RemoteOptions | None = None,
        load_path: _StorePath | RecordStore | None = None,  # old-name: AstrAI's
        window_size: int | None = None,
        storage_type: str | None = None,  # old-name: AstrAI's
    ) -> KeyedDataset | RecordDataset:
        """A :class:`KeyedDataset` of ``train_type`` over the store at ``path``.

        dpo and grpo without ``seq_len`` are record mode, as in AstrAI: a
        :class:`RecordDataset` over a store whose keys carry record offsets.
        ``path`` may be a URL (``s3://``, ...): ``remote`` (a RemoteOptions: endpoint, credentials,
        ``block_cache_dir``, ...; None: the environment's settings) then goes to ``tokenloom.formats.open_store``
        or, in record mode, ``open_records``, which read the store through the remote layer; the store keeps it
        and pickles with it (DataLoader workers). ``remote`` for a local path or a store object is a ConfigError.
        """
        path = _astrai_name("path", path, "load_path", load_path)  # old-name
        seq_len = _astrai_name("seq_len", seq_len, "window_size", window_size)
        format = _astrai_name("format", format, "storage_type", storage_type)  # old-name
        if path is None:
            raise ConfigError("DatasetFactory.load needs path (the store to read)", field="path")
        kind = check_choice(TrainType, train_type, "train_type")
        if seq_len is None or isinstance(path, RecordStore):
            if kind in (TrainType.SEQ, TrainType.SFT):
                raise ConfigError(f"{kind.value} needs window_size (seq_len): it is a token stream", field="seq_len")
            if not isinstance(path, RecordStore | str | os.PathLike):
                raise ConfigError("record mode needs a path or a RecordStore", field="path")
            return RecordDataset(path, kind.value, remote=remote)
        if isinstance(path, RecordStore):
            raise ConfigError("a RecordStore serves record mode only: drop seq_len", field="seq_len")
        try:
            store = open_keyed_store(path, format, kind, remote=remote)
        except DataError as exc:
            records = _record_store_or_none(path, kind, format, remote)
            if records is None:
                raise
            log.info(
                "%s: keys differ in length, so it is a record store (%s): %s serves records and ignores "
                "seq_len (window_size), as AstrAI's DatasetFactory does",
                path,
                exc.problem,
                kind.value,
            )
            return RecordDataset(records, kind.value)
        if _record_store_or_none(path, kind, format, remote) is not None:
            # every key carries offsets and the keys have equal lengths: tokenloom's segmented stream and
            # AstrAI's records look alike on disk; seq_len asks for windows, but say what AstrAI would do
            log.warning(
                "%s: its keys carry record offsets of equal total length, so it reads both as a %s stream "
                "(windows of %d, what seq_len asks for) and as AstrAI records (what AstrAI's MmapStore "
                "serves); pass seq_len=None (AstrAI: window_size=None for records)",
                path,
                kind.value,
                seq_len,
            )
        return KeyedDataset(store, kind, seq_len, stride, mask_alignment=mask_alignment)


def _astrai_name(new: str, value: Any, old: str, old_value: Any) -> Any:
    """``value``, or AstrAI's spelling ``old`` of keyword ``new`` (the seed's own name, accepted silently)."""
    if old_value is None:
        return value
    if value is not None:
        raise ConfigError(
            f"DatasetFactory.load got both {new}= and {old}= (AstrAI's name of {new})",
            field=new,
            hint=f"Pass only {new}=",
        )
    return old_value


def _record_store_or_none(
    path: object, kind: TrainType, format: str | None, remote: RemoteOptions | None
) -> RecordStore | None:
    """The record store at ``path`` for dpo/grpo (bin + meta.json with offsets; a URL read with ``remote``),
    or None if it is not one."""
    if kind not in (TrainType.DPO, TrainType.GRPO) or format not in (None, *RECORD_FORMATS):
        return None
    if not isinstance(path, str | os.PathLike):
        return None
    try:
        return open_records(path, remote=remote)
    except DataError:
        return None
