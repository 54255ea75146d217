"""The encoding engines: fast is chosen exactly when it gives hf's ids, and a difference stops a run."""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import fastokens
import numpy as np
import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tokenize_helpers import make_texts, output_digest
from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

from tokenloom.formats import ConfigError, open_dataset
from tokenloom.tokenize import TokenizeConfig, default_tokenizer_path, tokenize
from tokenloom.tokenize.engine import PROBE_TEXTS, EngineMismatchError, load_encoder, probe_set

BYTES = pre_tokenizers.ByteLevel.alphabet()
TRAIN = ["the quick brown fox jumps over the lazy dog \u00c9COLE \ufb01 \u2460 \u4e2d\u6587 12345 and more"] * 50


def _train(model: Any, trainer: Any, pre: Any = None, norm: Any = None) -> Tokenizer:
    tokenizer = Tokenizer(model)
    if pre is not None:
        tokenizer.pre_tokenizer = pre
    if norm is not None:
        tokenizer.normalizer = norm
    tokenizer.train_from_iterator(TRAIN, trainer)
    return tokenizer


def _bpe_trainer(**kw: Any) -> Any:
    return trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<eos>"], initial_alphabet=BYTES, show_progress=False, **kw
    )


def _sentencepiece_bpe() -> Tokenizer:
    """Llama-2 style: a normalizer that prepends and replaces with U+2581, no pre-tokenizer, byte fallback."""
    tokenizer = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    specials = ["<unk>", "<eos>"] + [f"<0x{i:02X}>" for i in range(256)]
    tokenizer.train_from_iterator(
        TRAIN, trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False)
    )
    return tokenizer


GPT4_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

TOKENIZERS: dict[str, Callable[[], Tokenizer]] = {
    "byte-level-bpe": lambda: _train(models.BPE(), _bpe_trainer(), pre_tokenizers.ByteLevel(add_prefix_space=False)),
    "byte-level-bpe-prefix-space": lambda: _train(
        models.BPE(), _bpe_trainer(), pre_tokenizers.ByteLevel(add_prefix_space=True)
    ),
    "split-regex-then-byte-level": lambda: _train(
        models.BPE(),
        _bpe_trainer(),
        pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(GPT4_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        ),
    ),
    "nfc-byte-level-bpe": lambda: _train(
        models.BPE(), _bpe_trainer(), pre_tokenizers.ByteLevel(add_prefix_space=False), normalizers.NFC()
    ),
    "sentencepiece-style-bpe": _sentencepiece_bpe,
    "metaspace-bpe": lambda: _train(
        models.BPE(unk_token="<unk>"),
        trainers.BpeTrainer(vocab_size=200, special_tokens=["<eos>", "<unk>"], show_progress=False),
        pre_tokenizers.Metaspace(),
    ),
    "nfkc-byte-level-bpe": lambda: _train(
        models.BPE(), _bpe_trainer(), pre_tokenizers.ByteLevel(add_prefix_space=False), normalizers.NFKC()
    ),
    "wordpiece": lambda: _train(
        models.WordPiece(unk_token="[UNK]"),
        trainers.WordPieceTrainer(
            vocab_size=300, special_tokens=["[UNK]", "<eos>"], initial_alphabet=BYTES, show_progress=False
        ),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ),
    "unigram": lambda: _train(
        models.Unigram(),
        trainers.UnigramTrainer(
            vocab_size=300, special_tokens=["<eos>", "<unk>"], unk_token="<unk>", show_progress=False
        ),
        pre_tokenizers.Metaspace(),
    ),
}
# What fastokens 0.3.5 refuses, and the component its error names.
REFUSED = {
    "metaspace-bpe": "Metaspace",
    "nfkc-byte-level-bpe": "NFKC",
    "wordpiece": "WordPiece",
    "unigram": "Metaspace",
}


def _independent_verdict(tokenizer: Tokenizer, texts: list[str]) -> bool | None:
    """None if fastokens cannot load it, else whether every text gets hf's ids (computed here, not by the engine)."""
    try:
        fast = fastokens.Tokenizer.from_json_str(tokenizer.to_str())
    except ValueError:
        return None
    for text in texts:
        got = np.frombuffer(fast.encode_batch_flat([text])[0], dtype=np.uint32).tolist()
        if got != tokenizer.encode(text, add_special_tokens=False).ids:
            return False
    return True


@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
def test_auto_picks_fast_exactly_when_the_ids_match(kind: str) -> None:
    tokenizer = TOKENIZERS[kind]()
    sample = ["some input text", "\u00c9COLE \ufb01 and <eos> inside"]
    texts = probe_set([t.content for t in tokenizer.get_added_tokens_decoder().values()], sample)
    verdict = _independent_verdict(tokenizer, texts)
    encoder = load_encoder(tokenizer, "auto", sample)
    assert encoder.name == ("fast" if verdict else "hf"), encoder.reason
    if kind in REFUSED:
        assert verdict is None and REFUSED[kind] in encoder.reason
        with pytest.raises(ConfigError, match=f"engine fast is unavailable: fastokens cannot load.*{REFUSED[kind]}"):
            load_encoder(tokenizer, "fast")
    else:
        assert verdict is True and "matched hf on all" in encoder.reason
        ids, offsets = encoder.encode_flat(texts)
        assert ids.dtype == np.uint32 and len(offsets) == len(texts) + 1
        hf = load_encoder(tokenizer, "hf")
        assert hf.name == "hf" and hf.encode_batch(texts) == encoder.encode_batch(texts)


def test_the_shipped_tokenizer_runs_on_fast_with_ids_equal_to_hf() -> None:
    encoder = load_encoder(default_tokenizer_path())
    assert encoder.name == "fast"
    reference = Tokenizer.from_file(str(default_tokenizer_path() / "tokenizer.json"))
    texts = [*PROBE_TEXTS, "<|endoftext|> in text<|endoftext|>", ""]
    assert encoder.encode_batch(texts) == [reference.encode(t, add_special_tokens=False).ids for t in texts]
    assert encoder.encode_batch(["<|endoftext|>"]) == [[0]]  # special tokens in text: matched, as hf does
    assert encoder.record()["name"] == "fast" and "fastokens" in encoder.record()


def _rstrip_tokenizer(second: str) -> Tokenizer:
    """A real disagreement: fastokens and tokenizers treat an rstrip added token before another added token apart."""
    tokenizer = _train(models.BPE(), _bpe_trainer(), pre_tokenizers.ByteLevel(add_prefix_space=False))
    tokenizer.add_special_tokens([AddedToken("<pad>", rstrip=True)])
    tokenizer.add_tokens([AddedToken(second)])
    return tokenizer


def test_a_probe_the_engines_disagree_on_makes_auto_fall_back_and_fast_fail() -> None:
    tokenizer = _rstrip_tokenizer(" and")
    assert _independent_verdict(tokenizer, ["<pad> and"]) is False
    encoder = load_encoder(tokenizer, "auto")
    assert encoder.name == "hf" and "differs from hf before the run" in encoder.reason
    with pytest.raises(EngineMismatchError, match=r"first at token \d+: fast \[.*\] vs hf \[.*probe text \d+"):
        load_encoder(tokenizer, "fast")


def test_the_input_sample_is_probed_too() -> None:
    tokenizer = _rstrip_tokenizer(" zebra")  # the fixed probes never put " zebra" after "<pad>"
    assert load_encoder(tokenizer, "auto").name == "fast"
    encoder = load_encoder(tokenizer, "auto", ["fine", "a <pad> zebra"])
    assert encoder.name == "hf" and "input sample text 1" in encoder.reason
    with pytest.raises(EngineMismatchError, match="input sample text 1"):
        load_encoder(tokenizer, "fast", ["fine", "a <pad> zebra"])


def test_the_run_time_check_is_deterministic_and_catches_a_difference() -> None:
    tokenizer = _rstrip_tokenizer(" zebra")
    texts = [f"document {i} <pad> zebra" if i == 7 else f"document {i}" for i in range(40)]
    every = load_encoder(tokenizer, "fast", verify_fraction=1.0)
    with pytest.raises(EngineMismatchError, match="document 7 differently during the run") as err:
        every.encode_flat(texts)
    assert err.value.record == 7
    none = load_encoder(tokenizer, "fast", verify_fraction=0.0)
    none.encode_flat(texts)  # nothing re-checked: the difference passes (this is what verify_fraction buys)
    default = load_encoder(tokenizer, "fast")  # 1 in 1,000, plus every text holding an added token
    assert default.selected(texts) == [7]  # type: ignore[attr-defined]
    with pytest.raises(EngineMismatchError, match="document 7"):
        default.encode_flat(texts)
    some = load_encoder(tokenizer, "fast", verify_fraction=0.1)
    chosen = some.selected(texts)  # type: ignore[attr-defined]
    assert 0 < len(chosen) < len(texts) and some.selected(texts) == chosen  # type: ignore[attr-defined]
    backwards = texts[::-1]  # chosen by content, not by position in the batch
    assert {texts[i] for i in chosen} == {backwards[i] for i in some.selected(backwards)}  # type: ignore[attr-defined]


def test_bad_engine_settings_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="engine is 'turbo'"):
        load_encoder(default_tokenizer_path(), "turbo")
    with pytest.raises(ConfigError, match="verify_fraction"):
        load_encoder(default_tokenizer_path(), "auto", verify_fraction=2.0)
    with pytest.raises(ConfigError, match="engine"):
        TokenizeConfig(input_dir=tmp_path, output_dir=tmp_path / "o", engine="turbo")
    with pytest.raises(ConfigError, match="verify_fraction"):
        TokenizeConfig(input_dir=tmp_path, output_dir=tmp_path / "o", verify_fraction=-0.1)


# -- in tokenize runs ------------------------------------------------------------------------


def _save(tokenizer: Tokenizer, directory: Path, eos: str = "<eos>") -> Path:
    directory.mkdir(parents=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos}
    (directory / "tokenizer_config.json").write_bytes(orjson.dumps(config))
    return directory


def _config(tokenizer: Path, corpus: Path, out: Path, **kw: Any) -> TokenizeConfig:
    options: dict[str, Any] = {"num_workers": 0, "shard_size_tokens": 3000, "seq_len": 32, "overlap_size": 8}
    return TokenizeConfig(input_dir=corpus, output_dir=out, tokenizer=str(tokenizer), **{**options, **kw})


@pytest.mark.parametrize("fmt", ["native", "megatron"])
def test_output_is_byte_identical_across_engines_and_worker_counts(
    tmp_path: Path,
    tiny_tokenizer: Path,
    jsonl_dir: Callable[..., Path],
    fmt: str,
) -> None:
    texts = [*make_texts(500, seed=3), *PROBE_TEXTS, "x <|endoftext|> y"]
    corpus = jsonl_dir(
        {"a.jsonl": [{"text": t} for t in texts[:300]], "b.jsonl.gz": [{"text": t} for t in texts[300:]]}
    )
    window: dict[str, Any] = {"overlap_size": 0} if fmt != "native" else {}
    digests = {}
    for engine in ("hf", "fast"):
        for workers in (0, 2):
            out = tmp_path / f"{engine}-{workers}"
            summary = tokenize(
                _config(
                    tiny_tokenizer,
                    corpus,
                    out,
                    engine=engine,
                    num_workers=workers,
                    format=fmt,
                    chunk_lines=53,
                    **window,
                )
            )
            assert summary.engine == engine
            digests[engine, workers] = output_digest(out)
    first = digests["hf", 0]
    assert all(d == first for d in digests.values())
    auto = tokenize(_config(tiny_tokenizer, corpus, tmp_path / "auto", format=fmt, verify_fraction=1.0, **window))
    assert auto.engine == "fast" and "matched hf on all" in auto.engine_reason
    assert output_digest(tmp_path / "auto") == digests["hf", 0]


def test_the_chosen_engine_and_reason_are_recorded(tmp_path: Path, jsonl_dir: Callable[..., Path]) -> None:
    corpus = jsonl_dir({"a.jsonl": [{"text": f"the quick brown fox {i}"} for i in range(50)]})
    metaspace = _save(TOKENIZERS["metaspace-bpe"](), tmp_path / "metaspace")
    summary = tokenize(_config(metaspace, corpus, tmp_path / "out"))
    record = open_dataset(tmp_path / "out").metadata["tokenize"]["engine"]
    assert summary.engine == record["name"] == "hf" and "Metaspace" in record["reason"] == summary.engine_reason
    with pytest.raises(ConfigError, match="Metaspace"):
        tokenize(_config(metaspace, corpus, tmp_path / "out2", engine="fast"))
    fast = tokenize(
        _config(default_tokenizer_path(), corpus, tmp_path / "out3", engine="fast", seq_len=None, overlap_size=0)
    )
    record = open_dataset(tmp_path / "out3").metadata["tokenize"]["engine"]
    assert fast.engine == record["name"] == "fast" and record["verify_fraction"] == 0.001
    assert record["fastokens"] == version("fastokens") and record["tokenizers"] == version("tokenizers")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mismatch_during_the_run_stops_it_resumably(
    tmp_path: Path,
    jsonl_dir: Callable[..., Path],
    workers: int,
) -> None:
    tokenizer = _save(_rstrip_tokenizer(" zebra"), tmp_path / "tok")
    texts = make_texts(900, seed=4)
    texts[700] = "here the engines part: <pad> zebra"  # after the probed sample, in a later shard
    corpus = jsonl_dir({"a.jsonl": [{"text": t} for t in texts]})
    out = tmp_path / "out"
    size = (corpus / "a.jsonl").stat().st_size
    options: dict[str, Any] = {"num_workers": workers, "chunk_lines": 50, "unit_bytes": size // 6}  # default verify
    with pytest.raises(EngineMismatchError, match=r"encode the document differently during the run") as err:
        tokenize(_config(tokenizer, corpus, out, **options))
    assert err.value.record == 701 and err.value.path == str(corpus / "a.jsonl")
    assert "--engine hf" in str(err.value)
    committed = len(list(out.glob(".tokenloom-unit-*.done")))
    assert committed  # units before the mismatch are kept: resumable
    resumed = tokenize(_config(tokenizer, corpus, out, **{**options, "engine": "hf"}))
    assert resumed.resumed_units == committed and resumed.engine == "hf"
    whole = tokenize(_config(tokenizer, corpus, tmp_path / "whole", engine="hf", unit_bytes=size // 6))
    assert whole.tokens == resumed.tokens
    assert output_digest(out) == output_digest(tmp_path / "whole")


def test_a_planted_mismatch_in_the_fast_engine_stops_the_run_at_the_default_fraction(
    tmp_path: Path, tiny_tokenizer: Path, jsonl_dir: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import xxhash

    from tokenloom.tokenize import _worker as worker_module
    from tokenloom.tokenize import engine as engine_module

    # a document the default 1-in-1000 check re-encodes (chosen by content hash), far after the probed sample
    victim = next(
        f"text number {i}"
        for i in range(1000, 10**6)
        if xxhash.xxh3_64_intdigest(f"text number {i}".encode()) < 2**64 // 1000
    )
    texts = [f"filler {i}" for i in range(1500)] + [victim] + [f"filler {i}" for i in range(1500, 1600)]
    corpus = jsonl_dir({"a.jsonl": [{"text": t} for t in texts]})
    real_load = engine_module._load_fast

    class Planted:
        def __init__(self, fast: Any) -> None:
            self.fast = fast

        def encode_batch_flat(self, batch: list[str]) -> tuple[bytes, bytes]:
            ids, offsets = self.fast.encode_batch_flat(batch)
            if victim not in batch:
                return ids, offsets
            planted = np.frombuffer(ids, dtype=np.uint32).copy()
            planted[int(np.frombuffer(offsets, dtype=np.uint64)[batch.index(victim)])] += 1
            return planted.tobytes(), offsets

    monkeypatch.setattr(engine_module, "_load_fast", lambda backend: Planted(real_load(backend)))
    monkeypatch.setattr(worker_module, "_ENCODERS", {})  # num_workers=0 encodes here: no encoder from before
    with pytest.raises(EngineMismatchError, match="first at token 0") as err:
        tokenize(_config(tiny_tokenizer, corpus, tmp_path / "out", chunk_lines=100))
    assert err.value.record == 1501 and err.value.field == "engine"
    unplanted = load_encoder(tiny_tokenizer, "fast")
    assert unplanted.selected([victim]) == [0]  # type: ignore[attr-defined]


def test_the_command_takes_engine_and_prints_its_choice(
    tmp_path: Path, tiny_tokenizer: Path, jsonl_dir: Callable[..., Path]
) -> None:
    from click.testing import CliRunner

    from tokenloom.tokenize._commands import tokenize as command

    corpus = jsonl_dir({"a.jsonl": [{"text": "one two"}, {"text": "four"}]})
    args = ["--input-dir", str(corpus), "--tokenizer", str(tiny_tokenizer), "--num-workers", "0", "--no-progress"]
    assert "--engine [auto|hf|fast]" in CliRunner().invoke(command, ["--help"]).output
    result = CliRunner().invoke(command, [*args, "--output-dir", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    assert "engine fast: fastokens loads the tokenizer and matched hf on all" in result.output
    result = CliRunner().invoke(command, [*args, "--output-dir", str(tmp_path / "b"), "--engine", "hf"])
    assert result.exit_code == 0 and "engine hf: engine hf requested" in result.output
    bad = CliRunner().invoke(command, [*args, "--output-dir", str(tmp_path / "c"), "--engine", "turbo"])
    assert bad.exit_code == 2 and "turbo" in bad.output
    bad = CliRunner().invoke(command, [*args, "--output-dir", str(tmp_path / "c"), "--verify-fraction", "2"])
    assert bad.exit_code == 2 and "verify-fraction" in bad.output


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["text", "a", "b"]), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@example(records=[b'{"text": "x"}', b'{"a": 1, "text": ""}'], field=("text",))
@example(records=[b'{"a": {"text": "x"}}', b'{"a": {"text": "y", "b": 2}}'], field=("a", "text"))
@example(records=[b'{"text": "x"}', b'["text"]'], field=("text",))
@given(
    records=st.lists(_JSON.map(orjson.dumps) | st.binary(max_size=12) | st.none(), max_size=6),
    field=st.sampled_from([("text",), ("a", "text"), ("a", "b")]),
)
def test_the_one_pass_parse_agrees_with_the_line_by_line_checks(
    records: list[bytes | None], field: tuple[str, ...]
) -> None:
    """A chunk parsed in one pass gives exactly the texts of the careful path, or goes down the careful path."""
    from tokenloom.tokenize._worker import _text_of, _texts_of_clean_chunk

    careful = [_text_of(line, field, n) if line is not None else None for n, line in enumerate(records)]
    fast = _texts_of_clean_chunk(records, field)
    if all(isinstance(text, str) for text in careful):
        assert fast == careful
    else:
        assert fast is None


def test_a_tokenizer_file_that_loads_in_neither_engine_is_a_config_error(
    tmp_path: Path, jsonl_dir: Callable[..., Path]
) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(default_tokenizer_path(), broken)
    (broken / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": 3}}')
    corpus = jsonl_dir({"a.jsonl": [{"text": "x"}]})
    for engine in ("auto", "fast", "hf"):
        with pytest.raises(ConfigError, match="tokenizers cannot load this tokenizer.json") as err:
            tokenize(_config(broken, corpus, tmp_path / f"out-{engine}", engine=engine, num_workers=1))
        assert err.value.path == str(broken / "tokenizer.json")


def test_truncation_and_padding_stored_in_tokenizer_json_never_cut_a_document(
    tmp_path: Path, jsonl_dir: Callable[..., Path]
) -> None:
    tokenizer = TOKENIZERS["byte-level-bpe"]()
    text = "the quick brown fox jumps over the lazy dog " * 4
    full = tokenizer.encode(text, add_special_tokens=False).ids
    tokenizer.enable_truncation(4)
    tokenizer.enable_padding(length=64, pad_id=0, pad_token="<eos>")
    directory = _save(tokenizer, tmp_path / "tok")
    corpus = jsonl_dir({"a.jsonl": [{"text": text}, {"text": "a"}]})
    for engine in ("hf", "fast"):
        out = tmp_path / engine
        tokenize(_config(directory, corpus, out, engine=engine, seq_len=None, overlap_size=0))
        ds = open_dataset(out)
        assert ds[0].tolist() == [*full, 0] and len(full) > 4  # not truncated to 4, not padded to 64
        assert ds[1].tolist() == [*tokenizer.encode("a", add_special_tokens=False).ids[:1], 0]
