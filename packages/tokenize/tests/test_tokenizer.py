"""The shipped tokenizer, tokenizer fingerprints and BPE training."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tokenloom.formats import ConfigError
from tokenloom.tokenize import EOS_TOKEN, default_tokenizer_path, fingerprint, train_byte_level_bpe


def test_shipped_tokenizer_loads_with_auto_tokenizer_and_has_an_eos() -> None:
    path = default_tokenizer_path()
    assert {p.name for p in path.iterdir()} == {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    assert sum(p.stat().st_size for p in path.iterdir()) < 2_000_000
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.eos_token == EOS_TOKEN and tok.eos_token_id == 0 and tok.pad_token_id == 0
    assert len(tok) == 16384
    ids = tok("def f(x):\n    return x", add_special_tokens=False)["input_ids"]
    assert 0 not in ids and tok.decode(ids) == "def f(x):\n    return x"


def test_fingerprint_follows_the_files(tmp_path: Path) -> None:
    copy = tmp_path / "tok"
    shutil.copytree(default_tokenizer_path(), copy)
    before = fingerprint(str(copy))
    assert before == fingerprint(str(default_tokenizer_path()))
    (copy / "model.safetensors").write_bytes(b"weights are not part of a tokenizer")
    assert fingerprint(str(copy)) == before
    (copy / "special_tokens_map.json").write_text('{"eos_token": "<|other|>"}')
    assert fingerprint(str(copy)) != before


def test_unknown_tokenizer_is_a_config_error_without_network(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="neither a local directory nor a name in the local"):
        fingerprint("no-such-org/no-such-tokenizer")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds none of"):
        fingerprint(str(tmp_path / "empty"))


def test_training_is_deterministic_and_validated(tmp_path: Path) -> None:
    texts = ["the cat sat on the mat", "the dog sat on the log"] * 20
    a = train_byte_level_bpe(texts, tmp_path / "a", vocab_size=280)
    b = train_byte_level_bpe(texts, tmp_path / "b", vocab_size=280)
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    with pytest.raises(ConfigError, match="vocab_size"):
        train_byte_level_bpe(texts, tmp_path / "c", vocab_size=100)
