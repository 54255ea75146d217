"""Cache (content-addressed, atomic, checksum-verified, rebuilt on corruption) and the eval-set sources."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from tokenloom.eval_broadcast import (
    CacheWarning,
    EvalBuildError,
    EvalTokens,
    HFEvalSource,
    PathEvalSource,
    broadcast_eval_set,
    encode_documents,
)
from tokenloom.formats import ConfigError, open_writer

datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")


def expected_stream(tokenizer_dir, texts):
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    stream = []
    for text in texts:
        stream += tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return np.array(stream), tok.eos_token_id


def test_hf_source_has_the_seed_semantics_and_matches_datasets(texts, tokenizer_dir, jsonl, tmp_path):
    from tokenloom.datasets import HuggingFaceDataset

    source = HFEvalSource("json", data_files=str(jsonl), split="train", tokenizer=str(tokenizer_dir))
    evalset = broadcast_eval_set(source, seq_len=6, drop_remainder=True)
    stream, eos = expected_stream(tokenizer_dir, texts)
    rows = len(stream) // 7
    assert evalset.numpy().tolist() == stream[: rows * 7].reshape(rows, 7).tolist()
    assert evalset.eos_id == eos and source.documents_tokenized == len(texts)
    # the same windows as tokenloom.datasets' HF eager dataset (the training side)
    training = HuggingFaceDataset(
        "json", data_files=str(jsonl), seq_len=6, tokenizer=str(tokenizer_dir), cache_dir=tmp_path / "hf"
    )
    assert len(training) == rows
    for i in range(rows):
        assert training[i]["input_ids"].tolist() == evalset.numpy()[i, :-1].tolist()
    kept = broadcast_eval_set(source, seq_len=6)  # the remainder kept as a padded last row
    assert len(kept) == rows + (len(stream) % 7 > 0)
    assert kept.num_tokens == len(stream)


def test_encode_documents_adds_eos_without_special_tokens(tokenizer_dir):
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    tokens, lengths = encode_documents(tok, ["a cat", "", "the dog"], eos_id=tok.eos_token_id)
    assert lengths.tolist() == [len(tok("a cat", add_special_tokens=False)["input_ids"]) + 1, 1, lengths[2]]
    assert tokens[np.cumsum(lengths) - 1].tolist() == [tok.eos_token_id] * 3
    assert tokens.sum() > 0 and int(lengths.sum()) == len(tokens)


def test_engine_selection_never_changes_the_ids(tokenizer_dir, jsonl):
    """The HF source encodes through tokenloom-tokenize's engine selection; the ids never depend on it."""
    from tokenloom.tokenize import default_tokenizer_path, load_encoder

    shipped = transformers.AutoTokenizer.from_pretrained(default_tokenizer_path())
    texts = ["a cat", "", "the dog sat", "é ✓ 中文", "  spaced\n\ttabs"]
    fast = load_encoder(shipped, "fast")  # the shipped byte-level BPE passes the identity probe
    assert fast.name == "fast"
    got = encode_documents(shipped, texts, eos_id=shipped.eos_token_id, encoder=fast)
    want = encode_documents(shipped, texts, eos_id=shipped.eos_token_id)
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
    rows = {}
    for engine in ("hf", "auto"):  # this test tokenizer has no byte fallback: auto must pick hf, and say so
        source = HFEvalSource("json", data_files=str(jsonl), split="train", tokenizer=str(tokenizer_dir), engine=engine)
        rows[engine] = broadcast_eval_set(source, seq_len=6).numpy().tolist()
        assert source.engine_record is not None and source.engine_record["name"] == "hf"
    assert rows["hf"] == rows["auto"]


@pytest.mark.parametrize("engine", ["hf", "auto"])
def test_a_record_without_a_text_string_is_named(tokenizer_dir, tmp_path, engine):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a cat"}\n{"other": 1}\n{"text": 5}\n')
    source = HFEvalSource("json", data_files=str(bad), split="train", tokenizer=str(tokenizer_dir), engine=engine)
    with pytest.raises(EvalBuildError, match=r"RecordError.*row 1 of split 'train' has NoneType in column 'text'"):
        broadcast_eval_set(source, seq_len=6)


def test_hf_source_missing_text_field_and_split(tokenizer_dir, jsonl):
    source = HFEvalSource("json", data_files=str(jsonl), split="train", text_field="body", tokenizer=str(tokenizer_dir))
    with pytest.raises(EvalBuildError, match="MissingKeyError.*body"):
        broadcast_eval_set(source, seq_len=6)
    missing = HFEvalSource("json", data_files=str(jsonl), split="validation", tokenizer=str(tokenizer_dir))
    with pytest.raises(EvalBuildError, match="validation"):
        broadcast_eval_set(missing, seq_len=6)
    with pytest.raises(EvalBuildError, match="does not exist"):
        broadcast_eval_set(
            HFEvalSource("json", data_files=str(jsonl) + ".gone", tokenizer=str(tokenizer_dir)),
            seq_len=6,
            cache_dir=jsonl.parent / "c",
        )


def test_second_start_reads_the_cache_and_tokenizes_nothing(texts, tokenizer_dir, jsonl, tmp_path):
    def source():
        return HFEvalSource("json", data_files=str(jsonl), split="train", tokenizer=str(tokenizer_dir))

    first_source = source()
    first = broadcast_eval_set(first_source, seq_len=6, cache_dir=tmp_path / "cache")
    assert first.origin == "built" and first_source.documents_tokenized == len(texts)
    entries = list((tmp_path / "cache").iterdir())
    assert [p.name for p in entries] == [Path(first.cache_path or "").name]  # no scratch left behind
    second_source = source()
    second = broadcast_eval_set(second_source, seq_len=6, cache_dir=tmp_path / "cache")
    assert second.origin == "cache" and second_source.documents_tokenized == 0
    assert second.numpy().tobytes() == first.numpy().tobytes() and second.tail_padding == first.tail_padding
    assert second.eos_id == first.eos_id and second.vocab_size == first.vocab_size
    # another setting or changed data -> another key
    third = broadcast_eval_set(source(), seq_len=5, cache_dir=tmp_path / "cache")
    assert third.origin == "built" and third.cache_path != first.cache_path
    jsonl.write_text(jsonl.read_text() + json.dumps({"text": "a new dog"}) + "\n")
    changed_source = source()
    changed = broadcast_eval_set(changed_source, seq_len=6, cache_dir=tmp_path / "cache")
    assert changed.origin == "built" and changed_source.documents_tokenized == len(texts) + 1


@pytest.mark.parametrize("damage", ["flip", "truncate", "manifest"])
def test_a_corrupted_cache_is_rebuilt_with_a_warning(tmp_path, damage):
    tokens = np.arange(1000) % 97
    calls = []

    def build():
        calls.append(1)
        return EvalTokens(tokens, eos_id=96, vocab_size=97)

    first = broadcast_eval_set(build, seq_len=9, cache_dir=tmp_path, cache_key="k")
    entry = Path(first.cache_path or "")
    data = next(entry.glob("*.bin"))
    if damage == "flip":
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0x01
        data.write_bytes(bytes(raw))
    elif damage == "truncate":
        os.truncate(data, data.stat().st_size - 2)
    else:
        (entry / "manifest.json").write_text("{not json")
    with pytest.warns(CacheWarning, match="unusable"):
        second = broadcast_eval_set(build, seq_len=9, cache_dir=tmp_path, cache_key="k")
    assert len(calls) == 2 and second.origin == "built"
    assert second.numpy().tobytes() == first.numpy().tobytes()
    third = broadcast_eval_set(build, seq_len=9, cache_dir=tmp_path, cache_key="k")
    assert third.origin == "cache" and len(calls) == 2


def test_a_flip_the_fast_manifest_check_cannot_see_is_caught_by_the_rows_checksum(tmp_path):
    from tokenloom.formats import open_dataset

    first = broadcast_eval_set(lambda: np.arange(200) % 50, seq_len=9, cache_dir=tmp_path, cache_key="k")
    entry = Path(first.cache_path or "")
    data = next(entry.glob("*.bin"))
    raw = bytearray(data.read_bytes())
    raw[-3] ^= 0x01
    data.write_bytes(bytes(raw))
    assert open_dataset(entry).num_tokens == 200  # sizes and index still verify
    with pytest.warns(CacheWarning, match="checksum"):
        again = broadcast_eval_set(lambda: np.arange(200) % 50, seq_len=9, cache_dir=tmp_path, cache_key="k")
    assert again.origin == "built" and again.numpy().tobytes() == first.numpy().tobytes()


def test_a_plain_callable_needs_a_cache_key(tmp_path):
    built = []

    def build():
        built.append(1)
        return np.arange(20)

    # the caller's mistake is a ConfigError naming the option, raised before anything is built
    with pytest.raises(ConfigError, match="cache_key") as caught:
        broadcast_eval_set(build, seq_len=4, cache_dir=tmp_path)
    assert not isinstance(caught.value, EvalBuildError) and caught.value.field == "cache_key"
    assert built == [] and list(tmp_path.iterdir()) == []


def test_path_source_reads_any_open_dataset_path(tmp_path):
    with open_writer(tmp_path / "val", dtype="uint16", vocab_size=100, eos_id=99) as writer:
        writer.add_batch(np.array([1, 2, 99, 3, 4, 5, 99, 6, 99]), np.array([3, 4, 2]))
    evalset = broadcast_eval_set(PathEvalSource(tmp_path / "val"), seq_len=3, cache_dir=tmp_path / "c")
    assert evalset.numpy().tolist() == [[1, 2, 99, 3], [4, 5, 99, 6], [99, 99, 99, 99]]
    assert evalset.tail_padding == 3 and evalset.eos_id == 99 and evalset.vocab_size == 100
    again = broadcast_eval_set(PathEvalSource(tmp_path / "val"), seq_len=3, cache_dir=tmp_path / "c")
    assert again.origin == "cache"


def test_path_source_refuses_overlapping_windows(tmp_path):
    with open_writer(tmp_path / "val", dtype="uint16", vocab_size=100, eos_id=99) as writer:
        writer.add(np.array([1, 2, 3, 4]))
        writer.add(np.array([3, 4, 5, 99]), overlap_prefix=2)
    with pytest.raises(EvalBuildError, match="overlap"):
        broadcast_eval_set(PathEvalSource(tmp_path / "val"), seq_len=3)
