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


# -- the transformers-free description ------------------------------------------------------

_TEXTS = [
    "def f(x):\n    return x  # tabs\tand  spaces",
    "Ünïcödé, emoji 🙂 and <|endoftext|> inside text",
    "",
    "   leading spaces",
]


def _same_as_transformers(directory) -> None:
    from tokenloom.tokenize._tokenizer import BackendTokenizer, LoadedTokenizer, describe, describe_plain

    plain = describe_plain(str(directory))
    assert plain is not None
    info, serialized = describe(str(directory))
    assert plain[0] == info
    assert BackendTokenizer(plain[1]).encode_batch(_TEXTS) == LoadedTokenizer(str(directory)).encode_batch(_TEXTS)
    assert BackendTokenizer(plain[1]).encode_batch(_TEXTS) == BackendTokenizer(serialized or "").encode_batch(_TEXTS)


def test_plain_description_matches_transformers_for_the_shipped_tokenizer() -> None:
    from tokenloom.tokenize import default_tokenizer_path

    _same_as_transformers(default_tokenizer_path())


def test_plain_description_matches_transformers_for_a_trained_tokenizer(tmp_path) -> None:
    from tokenloom.tokenize import train_byte_level_bpe

    texts = ["the quick brown fox jumps over the lazy dog " * 3, "pack my box with five dozen liquor jugs"] * 50
    _same_as_transformers(train_byte_level_bpe(texts, tmp_path / "tok", vocab_size=400, min_frequency=1))


def test_plain_description_declines_what_transformers_would_change(tmp_path) -> None:
    import json
    import shutil

    from tokenloom.tokenize import default_tokenizer_path
    from tokenloom.tokenize._tokenizer import describe_plain

    def variant(name: str, change) -> str:
        target = tmp_path / name
        shutil.copytree(default_tokenizer_path(), target)
        config = json.loads((target / "tokenizer_config.json").read_text())
        change(config)
        (target / "tokenizer_config.json").write_text(json.dumps(config))
        return str(target)

    assert describe_plain(variant("llama", lambda c: c.update(tokenizer_class="LlamaTokenizerFast"))) is None
    assert describe_plain(variant("prefix", lambda c: c.update(add_prefix_space=True))) is None
    assert describe_plain(variant("new-eos", lambda c: c.update(eos_token="<|not-in-vocab|>"))) is None
    assert describe_plain(str(tmp_path / "missing")) is None
