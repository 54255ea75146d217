"""One vocabulary: ``train_type`` and ``format`` everywhere; the old names warn for one release.

For each renamed keyword: the new name works, the old one gives the same result with a DeprecationWarning
that names the new one, and both together are a ConfigError. Renamed attributes and constants warn too.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import tokenloom.formats
import tokenloom.formats.keyed
import tokenloom.formats.keyed.store
from tokenloom.formats import TRAIN_TYPE_KEYS, ConfigError, MissingKeyError, open_store, open_writer
from tokenloom.formats.keyed import BinMetaStoreWriter

SFT = {"sequence": np.array([5, 6, 7, 8], dtype=np.uint16), "loss_mask": np.array([0, 1, 1, 1], dtype=np.uint8)}


def new_name_only(call):
    """``call()`` with every warning an error: the new names must not warn."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return call()


def write_sft(path: Path, **names) -> Path:
    with open_writer(path, format="bin-meta", dtype="uint16", vocab_size=10, **names) as writer:
        writer.add_keyed(SFT)
    return path


def contents(path: Path) -> dict[str, list[int]]:
    store = new_name_only(lambda: open_store(path))
    return {key: store.fetch(0, len(store), key).tolist() for key in store.keys}


@pytest.fixture
def sft_store(tmp_path: Path) -> Path:
    return new_name_only(lambda: write_sft(tmp_path / "sft", train_type="sft"))


@pytest.mark.parametrize(
    ("new", "old", "value"),
    [("train_type", "training_type", "sft"), ("format", "storage_type", "bin")],
)
def test_open_store_keywords(sft_store: Path, new: str, old: str, value: str) -> None:
    want = new_name_only(lambda: open_store(sft_store, **{new: value}))
    with pytest.warns(DeprecationWarning, match=rf"open_store: {old}= is deprecated, use {new}=") as caught:
        got = open_store(sft_store, **{old: value})
    assert caught[0].filename == __file__  # the warning points at the caller
    assert (
        (got.keys, len(got), got.format) == (want.keys, len(want), want.format) == (["loss_mask", "sequence"], 4, "bin")
    )
    with pytest.raises(ConfigError, match=rf"got both {new}= and {old}="):
        open_store(sft_store, **{new: value, old: value})


def test_open_store_old_training_type_still_checks_keys(sft_store: Path) -> None:
    with pytest.raises(MissingKeyError), pytest.warns(DeprecationWarning, match="use train_type="):
        open_store(sft_store, training_type="dpo")
    with pytest.raises(MissingKeyError):
        open_store(sft_store, train_type="dpo")


def test_open_store_takes_the_token_format_name_too(sft_store: Path) -> None:
    assert new_name_only(lambda: open_store(sft_store, "bin-meta", train_type="sft")).format == "bin"


def test_store_writer_keyword(tmp_path: Path, sft_store: Path) -> None:
    with pytest.warns(
        DeprecationWarning, match="BinMetaStoreWriter: training_type= is deprecated, use train_type="
    ) as w:
        old = write_sft(tmp_path / "old", training_type="sft")
    assert w[0].filename == __file__  # open_writer's caller
    assert contents(old) == contents(sft_store)
    with pytest.warns(DeprecationWarning, match="use train_type="), pytest.raises(ConfigError, match="expected one of"):
        BinMetaStoreWriter(tmp_path / "bad", dtype="uint16", training_type="nope")
    with pytest.raises(ConfigError, match="got both train_type= and training_type="):
        BinMetaStoreWriter(tmp_path / "both", dtype="uint16", train_type="sft", training_type="sft")
    with (
        pytest.raises(MissingKeyError),
        open_writer(tmp_path / "x", format="bin-meta", dtype="uint16", train_type="dpo") as w,
    ):
        w.add_keyed(SFT)  # train_type fixes the keys, as training_type did


def test_require_keyword(sft_store: Path) -> None:
    store = open_store(sft_store)
    new_name_only(lambda: store.require("sft"))
    new_name_only(lambda: store.require(train_type="sft"))
    with pytest.warns(DeprecationWarning, match="KeyedStore.require: training_type= is deprecated"):
        store.require(training_type="sft")
    with pytest.raises(ConfigError, match="got both"):
        store.require(train_type="sft", training_type="sft")
    with pytest.raises(ConfigError, match="train_type"):
        store.require()


def test_store_attributes(sft_store: Path) -> None:
    store = open_store(sft_store)
    assert new_name_only(lambda: (store.train_type, store.format)) == ("sft", "bin")
    with pytest.warns(DeprecationWarning, match=r"BinStore.training_type is deprecated, use .train_type"):
        assert store.training_type == "sft"
    with pytest.warns(DeprecationWarning, match=r"BinStore.storage_type is deprecated, use .format"):
        assert store.storage_type == "bin"


@pytest.mark.parametrize("module", [tokenloom.formats, tokenloom.formats.keyed, tokenloom.formats.keyed.store])
def test_constants(module) -> None:
    assert module.TRAIN_TYPE_KEYS is TRAIN_TYPE_KEYS
    with pytest.warns(
        DeprecationWarning, match=rf"{module.__name__}.TRAINING_TYPE_KEYS is deprecated, use .*TRAIN_TYPE_KEYS"
    ):
        assert module.TRAINING_TYPE_KEYS is TRAIN_TYPE_KEYS
    with pytest.warns(DeprecationWarning, match="OPTIONAL_TRAIN_TYPE_KEYS"):
        assert module.OPTIONAL_TRAINING_TYPE_KEYS is module.OPTIONAL_TRAIN_TYPE_KEYS
    with pytest.raises(AttributeError, match="no attribute 'NOPE'"):
        _ = module.NOPE


def test_from_import_of_an_old_constant_warns() -> None:
    with pytest.warns(DeprecationWarning, match="use tokenloom.formats.TRAIN_TYPE_KEYS"):
        from tokenloom.formats import TRAINING_TYPE_KEYS  # noqa: F401
    with pytest.warns(DeprecationWarning, match="use tokenloom.formats.keyed.store.train_type_of"):
        from tokenloom.formats.keyed.store import training_type_of
    assert training_type_of(["sequence"]) == tokenloom.formats.keyed.store.train_type_of(["sequence"]) == "seq"
