"""One vocabulary: ``train_type`` and ``format`` everywhere; the old names are gone (no shims)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tokenloom.formats
import tokenloom.formats.keyed
import tokenloom.formats.keyed.store
from tokenloom.formats import TRAIN_TYPE_KEYS, ConfigError, MissingKeyError, open_store, open_writer
from tokenloom.formats.keyed import BinMetaStoreWriter

SFT = {"sequence": np.array([5, 6, 7, 8], dtype=np.uint16), "loss_mask": np.array([0, 1, 1, 1], dtype=np.uint8)}


@pytest.fixture
def sft_store(tmp_path: Path) -> Path:
    path = tmp_path / "sft"
    with open_writer(path, format="bin-meta", dtype="uint16", vocab_size=10, train_type="sft") as writer:
        writer.add_keyed(SFT)
    return path


def test_open_store_keywords(sft_store: Path) -> None:
    store = open_store(sft_store, format="bin", train_type="sft")
    assert (store.keys, len(store), store.format, store.train_type) == (["loss_mask", "sequence"], 4, "bin", "sft")
    assert open_store(sft_store, "bin-meta", train_type="sft").format == "bin"  # the token format's name too
    with pytest.raises(MissingKeyError):
        open_store(sft_store, train_type="dpo")
    with pytest.raises(TypeError):
        open_store(sft_store, training_type="sft")  # pyright: ignore[reportCallIssue]


def test_store_writer_and_require(tmp_path: Path, sft_store: Path) -> None:
    with pytest.raises(ConfigError, match="expected one of"):
        BinMetaStoreWriter(tmp_path / "bad", dtype="uint16", train_type="nope")
    with (
        pytest.raises(MissingKeyError),
        open_writer(tmp_path / "x", format="bin-meta", dtype="uint16", train_type="dpo") as w,
    ):
        w.add_keyed(SFT)  # train_type fixes the keys
    store = open_store(sft_store)
    store.require("sft")
    store.require(train_type="sft")
    with pytest.raises(ConfigError, match="train_type"):
        store.require()


@pytest.mark.parametrize("module", [tokenloom.formats, tokenloom.formats.keyed, tokenloom.formats.keyed.store])
def test_old_constants_are_gone(module) -> None:
    assert module.TRAIN_TYPE_KEYS is TRAIN_TYPE_KEYS
    for old in ("TRAINING_TYPE_KEYS", "OPTIONAL_TRAINING_TYPE_KEYS"):
        assert not hasattr(module, old)
