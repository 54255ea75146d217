"""HFEvalSource's ``skip_empty`` (issue #21): KempnerForge skips texts that encode to no tokens.

The reference is KempnerForge's eager eval-set construction (``HuggingFaceDataset._pack_sequences``
at 5666d0d), re-stated here from its documented semantics: ``tokenizer.encode(text,
add_special_tokens=False)``, ``if not tokens: continue``, tokens plus EOS appended to a buffer, full
chunks of ``seq_len + 1`` flushed, the partial remainder dropped; the rows are stacked into the tensor
rank 0 broadcasts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from tokenloom.eval_broadcast import HFEvalSource, broadcast_eval_set
from tokenloom.formats import ConfigError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

SEQ_LEN = 7
WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far"]


def kempnerforge_tensor(tokenizer_dir: Path, texts: list[str], seq_len: int) -> np.ndarray:
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    eos = tok.eos_token_id or 0
    chunk, buffer, packed = seq_len + 1, [], []
    for text in texts:
        tokens = tok.encode(text, add_special_tokens=False)
        if not tokens:
            continue
        buffer.extend(tokens)
        buffer.append(eos)
        while len(buffer) >= chunk:
            packed.append(np.array(buffer[:chunk], dtype=np.int64))
            buffer = buffer[chunk:]
    return np.stack(packed)


def corpus(tmp_path: Path) -> tuple[Path, list[str]]:
    """About 800 texts: empty ones early (row 0 on) and spread out, whitespace-only ones, real ones."""
    rng = np.random.default_rng(7)
    texts: list[str] = []
    for i in range(800):
        if i % 37 == 3:
            texts.append("")
        elif i % 53 == 5:
            texts.append(["  ", "\n", "\t \n"][i % 3])
        else:
            texts.append(" ".join(rng.choice(WORDS, size=int(rng.integers(1, 9)))))
    path = tmp_path / "val.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path, texts


@pytest.fixture(scope="module")
def word_level_dir(tmp_path_factory):
    """A tokenizer under which whitespace-only text also encodes to no tokens (Whitespace pre-tokenizer)."""
    directory = tmp_path_factory.mktemp("wl")
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="<unk>"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    model.train_from_iterator(
        [" ".join(WORDS)] * 5, tokenizers.trainers.WordLevelTrainer(special_tokens=["<unk>", "<eos>"])
    )
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=model, eos_token="<eos>", unk_token="<unk>")
    fast.save_pretrained(directory)
    return directory


def _tokenizer(kind: str, word_level_dir: Path) -> Path:
    if kind == "shipped-bpe":  # byte-level: whitespace-only text has tokens; the fast engine encodes
        from tokenloom.tokenize import default_tokenizer_path

        return Path(default_tokenizer_path())
    return word_level_dir


@pytest.mark.parametrize("kind", ["shipped-bpe", "word-level"])
def test_compat_kempnerforge_is_kempnerforges_eval_tensor(kind, word_level_dir, tmp_path):
    tokenizer = _tokenizer(kind, word_level_dir)
    path, texts = corpus(tmp_path)
    want = kempnerforge_tensor(tokenizer, texts, SEQ_LEN)
    assert len(want) > 200

    def rows(**options) -> np.ndarray:
        source = HFEvalSource("json", data_files=str(path), split="train", tokenizer=str(tokenizer), **options)
        return broadcast_eval_set(source, seq_len=SEQ_LEN, drop_remainder=True).numpy().astype(np.int64)

    for options in ({"compat": "kempnerforge"}, {"skip_empty": True}):
        got = rows(**options)
        assert got.shape == want.shape and np.array_equal(got, want), options
    default = rows()  # tokenloom's default: a lone EOS per empty text, so the rows shift from the first one
    assert not np.array_equal(default[: len(want)], want)
    assert np.array_equal(rows(compat="kempnerforge", skip_empty=False), default)
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer)
    no_tokens = sum(not tok.encode(t, add_special_tokens=False) for t in texts)
    source = HFEvalSource("json", data_files=str(path), split="train", tokenizer=str(tokenizer), skip_empty=True)
    broadcast_eval_set(source, seq_len=SEQ_LEN)
    assert source.documents_skipped == no_tokens and source.documents_tokenized == len(texts)
    assert no_tokens == (texts.count("") if kind == "shipped-bpe" else sum(not t.strip() for t in texts))


def test_skip_empty_is_part_of_the_cache_key(tmp_path):
    from tokenloom.tokenize import default_tokenizer_path

    tokenizer = str(default_tokenizer_path())
    path, texts = corpus(tmp_path)
    cache = tmp_path / "cache"

    def build(**options):
        source = HFEvalSource("json", data_files=str(path), split="train", tokenizer=tokenizer, **options)
        return broadcast_eval_set(source, seq_len=SEQ_LEN, drop_remainder=True, cache_dir=cache), source

    kept, _ = build(skip_empty=False)
    assert kept.origin == "built"
    skipped, source = build(skip_empty=True)  # must not be served the skip_empty=False entry
    assert skipped.origin == "built" and skipped.cache_path != kept.cache_path
    assert source.documents_tokenized == len(texts)
    assert np.array_equal(skipped.numpy(), kempnerforge_tensor(Path(tokenizer), texts, SEQ_LEN))
    again, source = build(compat="kempnerforge")  # the same setting: the same entry
    assert again.origin == "cache" and again.cache_path == skipped.cache_path and source.documents_tokenized == 0
    default, _ = build()
    assert default.origin == "cache" and default.cache_path == kept.cache_path


def test_bad_compat_and_skip_empty_are_named(tmp_path):
    with pytest.raises(ConfigError, match="compat='gpt-simple', expected None or 'kempnerforge'"):
        HFEvalSource("json", data_files="x.jsonl", tokenizer="tok", compat="gpt-simple")
    with pytest.raises(ConfigError, match="skip_empty='yes'"):
        HFEvalSource("json", data_files="x.jsonl", tokenizer="tok", skip_empty="yes")  # pyright: ignore[reportArgumentType]
