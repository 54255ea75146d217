"""HuggingFaceDataset on local json / parquet files and a tokenizer trained in tmp_path (no hub)."""

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

import tokenloom.datasets._hf as hf_module  # noqa: E402
from tokenloom.datasets import IGNORE_INDEX, HuggingFaceDataset, MemoryMappedDataset  # noqa: E402
from tokenloom.formats import ConfigError, MissingKeyError, open_writer  # noqa: E402

TEXTS = ["the cat sat on the mat", "a dog ran", "the dog sat", "cats and dogs and mats", "on the mat the cat ran"]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tok")
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="<unk>"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.WordLevelTrainer(special_tokens=["<unk>", "<eos>"])
    model.train_from_iterator(TEXTS, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=model, eos_token="<eos>", unk_token="<unk>")
    fast.save_pretrained(directory)
    return directory


@pytest.fixture
def jsonl(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    return path


def expected_stream(tokenizer_dir):
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    stream = []
    for text in TEXTS:
        stream += tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return stream, tok.eos_token_id


def _json_ds(jsonl: Path, tokenizer_dir: Path, cache_dir: Path, **options) -> HuggingFaceDataset:
    """The jsonl corpus in windows of 4 tokens, tokenized with the tokenizer at tokenizer_dir."""
    return HuggingFaceDataset(
        "json", data_files=str(jsonl), seq_len=4, tokenizer=str(tokenizer_dir), cache_dir=cache_dir, **options
    )


def test_json_is_tokenized_concatenated_and_sliced(tokenizer_dir, jsonl, tmp_path):
    ds = _json_ds(jsonl, tokenizer_dir, tmp_path / "cache")
    stream, _ = expected_stream(tokenizer_dir)
    assert len(ds) == len(stream) // 5  # chunks of seq_len + 1, remainder dropped
    for i in range(len(ds)):
        assert ds[i]["input_ids"].tolist() == stream[5 * i : 5 * i + 4]
        assert ds[i]["labels"].tolist() == stream[5 * i + 1 : 5 * i + 5]


def test_cache_is_reused_without_retokenizing(tokenizer_dir, jsonl, tmp_path, monkeypatch):
    kwargs = {"data_files": str(jsonl), "seq_len": 4, "tokenizer": str(tokenizer_dir), "cache_dir": tmp_path / "c"}
    first = HuggingFaceDataset("json", **kwargs)
    assert [p.name.startswith("hf-") for p in (tmp_path / "c").iterdir()] == [True]

    def fail(*args, **kwargs):
        raise AssertionError("re-tokenized although the cache exists")

    monkeypatch.setattr(hf_module.HuggingFaceDataset, "_build", fail)
    second = HuggingFaceDataset("json", **kwargs)
    assert second[0]["input_ids"].tolist() == first[0]["input_ids"].tolist()
    assert first.cache_path == second.cache_path
    with pytest.raises(AssertionError, match="re-tokenized"):  # another text field -> another key
        (tmp_path / "other.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in TEXTS))
        HuggingFaceDataset("json", **{**kwargs, "data_files": str(tmp_path / "other.jsonl")}, text_field="body")


def test_parquet_with_packing(tokenizer_dir, tmp_path):
    import datasets

    path = tmp_path / "data.parquet"
    datasets.Dataset.from_dict({"text": TEXTS}).to_parquet(str(path))
    ds = HuggingFaceDataset(
        "parquet",
        data_files=str(path),
        seq_len=8,
        tokenizer=str(tokenizer_dir),
        cache_dir=tmp_path / "c",
        pack_sequences=True,
    )
    stream, eos = expected_stream(tokenizer_dir)
    s = ds[0]
    window = stream[:9]
    assert s["input_ids"].tolist() == window[:8]
    first_eos = window.index(eos)
    assert s["doc_ids"].tolist() == [0 if j <= first_eos else 1 for j in range(8)]
    assert s["labels"][first_eos].item() == IGNORE_INDEX


def test_missing_text_field(tokenizer_dir, jsonl, tmp_path):
    with pytest.raises(MissingKeyError, match="body"):
        _json_ds(jsonl, tokenizer_dir, tmp_path, text_field="body")


def test_eos_from_tokenizer_path_for_memory_mapped_windows(tokenizer_dir, tmp_path):
    _, eos = expected_stream(tokenizer_dir)
    with open_writer(tmp_path / "d", dtype="uint16") as writer:  # no EOS recorded in the manifest
        writer.add(np.array([3, 4, eos, 5, 6, eos]))
    ds = MemoryMappedDataset(tmp_path / "d", seq_len=5, pack_sequences=True, tokenizer_path=tokenizer_dir)
    assert ds[0]["labels"].tolist() == [4, eos, IGNORE_INDEX, 6, eos]
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    with pytest.raises(ConfigError):
        MemoryMappedDataset(tmp_path / "d", seq_len=5, pack_sequences=True)


def test_two_gloo_ranks_rank_zero_builds_the_cache_once_and_both_read_it(tokenizer_dir, jsonl, tmp_path, monkeypatch):
    import importlib

    from tokenloom.testing.ranks import run_ranks

    monkeypatch.syspath_prepend(os.path.dirname(__file__))
    worker = importlib.import_module("_hf_dist_worker")
    (tmp_path / "out").mkdir()
    run_ranks(worker.run, (2, str(tmp_path / "init"), str(jsonl), str(tokenizer_dir), str(tmp_path)), 2, timeout_s=180)
    out = tmp_path / "out"
    builds = sorted(p.name.rsplit("-", 1)[0] for p in out.glob("build-*"))
    assert builds == ["build-rank0", "build-rank0"]  # once per cache, never on rank 1
    results = [json.loads((out / f"samples-rank{rank}.json").read_text()) for rank in (0, 1)]
    assert results[0] == results[1]
    stream, eos = expected_stream(tokenizer_dir)
    samples = results[0]["samples"]
    assert len(samples) == len(stream) // 5
    assert [s["input_ids"] for s in samples] == [stream[5 * i : 5 * i + 4] for i in range(len(samples))]
    assert samples[0]["doc_ids"] == [0 if j <= stream.index(eos) else 1 for j in range(4)]
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [Path(results[0]["cache"]).name]  # no scratch left
    assert (out / "failure-rank0.txt").read_text() == "RuntimeError: tokenizer crashed on rank 0"
    assert (out / "failure-rank1.txt").read_text().startswith("MissingFileError: ")
    assert "rank 0 did not publish" in (out / "failure-rank1.txt").read_text()


def test_cache_is_encoded_by_the_engine_selection_with_the_ids_of_tokenize(tokenizer_dir, jsonl, tmp_path):
    """The same engine choice as tokenloom tokenize, recorded in the cache; fast and hf give the same ids."""
    from tokenloom.formats import open_dataset
    from tokenloom.tokenize import TokenizeConfig, tokenize, train_byte_level_bpe

    bpe = train_byte_level_bpe(
        [*TEXTS, "<|endoftext|> and \u00c9cole \U0001f642"] * 20, tmp_path / "bpe", vocab_size=300
    )
    texts = [*TEXTS, "", "text with <|endoftext|> inside", "\u00c9cole \U0001f642 \u4e2d\u6587"]
    data = tmp_path / "in" / "data.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    summary = tokenize(
        TokenizeConfig(input_dir=data.parent, output_dir=tmp_path / "tok", tokenizer=str(bpe), num_workers=0)
    )
    offline = open_dataset(tmp_path / "tok")
    expected = np.concatenate([offline[i] for i in range(len(offline))]).tolist()
    streams = {}
    for engine in ("auto", "hf"):
        ds = HuggingFaceDataset(
            "json", data_files=str(data), seq_len=4, tokenizer=str(bpe), cache_dir=tmp_path / engine, engine=engine
        )
        cache = open_dataset(ds.cache_path)
        assert (
            cache.metadata["engine"]["name"]
            == ("fast" if engine == "auto" else "hf")
            == (summary.engine if engine == "auto" else "hf")
        )
        streams[engine] = np.concatenate([cache[i] for i in range(len(cache))]).tolist()
    assert streams["auto"] == streams["hf"] == expected
    word_level = _json_ds(jsonl, tokenizer_dir, tmp_path / "wl")
    record = open_dataset(word_level.cache_path).metadata["engine"]
    assert record["name"] == "hf" and "fastokens cannot load" in record["reason"]  # its Whitespace pre-tokenizer
    with pytest.raises(ConfigError, match="engine fast is unavailable"):
        _json_ds(jsonl, tokenizer_dir, tmp_path / "x", engine="fast")


def test_empty_texts_lone_eos_by_default_skipped_under_kempnerforge_compat(tokenizer_dir, tmp_path):
    texts = ["a dog ran", "", "the cat sat", ""]
    path = tmp_path / "empty.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    eos = tok.eos_token_id
    a, b = (tok(t, add_special_tokens=False)["input_ids"] for t in ("a dog ran", "the cat sat"))
    assert (len(a), len(b)) == (3, 3)
    common: dict[str, Any] = {"data_files": str(path), "seq_len": 2, "tokenizer": str(tokenizer_dir)}
    default = HuggingFaceDataset("json", **common, cache_dir=tmp_path / "c1")
    stream = [*a, eos, eos, *b, eos, eos]  # tokenloom's default: a lone EOS per empty text
    assert [default[i]["input_ids"].tolist() for i in range(len(default))] == [stream[0:2], stream[3:5], stream[6:8]]
    for compat, skip_empty in (("kempnerforge", None), (None, True)):
        kf = HuggingFaceDataset("json", **common, cache_dir=tmp_path / "c2", compat=compat, skip_empty=skip_empty)
        stream = [*a, eos, *b, eos]  # KempnerForge: texts with no tokens are skipped
        assert [kf[i]["input_ids"].tolist() for i in range(len(kf))] == [stream[0:2], stream[3:5]]
        assert kf.cache_path != default.cache_path
    explicit = HuggingFaceDataset("json", **common, cache_dir=tmp_path / "c3", compat="kempnerforge", skip_empty=False)
    assert len(explicit) == len(default)
    with pytest.raises(ConfigError, match="compat='gpt-simple', expected None or 'kempnerforge'"):
        HuggingFaceDataset("json", **common, cache_dir=tmp_path / "c4", compat="gpt-simple")


def test_engine_line_is_logged_once_per_process_for_one_tokenizer(tokenizer_dir, jsonl, tmp_path, caplog):
    """Building several caches with one tokenizer says which encoder it uses once, not once per cache (#21)."""
    import logging
    import shutil

    tokenizer = shutil.copytree(tokenizer_dir, tmp_path / "tok")  # a tokenizer this process has not announced yet
    with caplog.at_level(logging.INFO, logger="tokenloom"):
        for name in ("a", "b", "c"):
            HuggingFaceDataset(
                "json", data_files=str(jsonl), tokenizer=str(tokenizer), seq_len=8, cache_dir=tmp_path / name
            )
    lines = [r for r in caplog.records if "encoding engine" in r.getMessage() and r.levelno >= logging.INFO]
    assert len(lines) == 1, [r.getMessage() for r in lines]
