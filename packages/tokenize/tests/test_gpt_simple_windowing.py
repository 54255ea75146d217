"""`tokenize --windowing gpt-simple`: the rule end to end, its run key, and what it refuses.

The rule's exact entries against GPT-Simple's own pretokenize are proven in
integration-tests/tests/test_gpt_simple_interop.py; here the pipeline around it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from click.testing import CliRunner
from tokenize_helpers import gpt_reference
from tokenizers import Tokenizer, models, pre_tokenizers

from tokenloom.formats import ConfigError, RecordError, ResumeMismatchError, open_dataset
from tokenloom.tokenize import TokenizeConfig, Windowing, tokenize
from tokenloom.tokenize._commands import tokenize as tokenize_command
from tokenloom.tokenize._gpt_simple import gpt_simple_dtype

EOD = 0  # tiny_tokenizer's <|endoftext|>


def run(tokenizer: Path, input_dir: Path, out: Path, **kw: Any):
    options: dict[str, Any] = {"num_workers": 0, "shard_size_tokens": 300, "windowing": Windowing.GPT_SIMPLE}
    options.update(kw)
    return tokenize(TokenizeConfig(input_dir=input_dir, output_dir=out, tokenizer=str(tokenizer), **options))


def expected_entries(texts: list[str], tokenizer: Path, max_length: int, overlap: int, min_chars: int) -> list:
    """GPT-Simple's rule applied by hand to each kept document's ids (tokenize_helpers.gpt_reference)."""
    tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    docs = [tok.encode(text, add_special_tokens=False).ids for text in texts if len(text) >= min_chars]
    return gpt_reference(docs, max_length, overlap, EOD)


@pytest.fixture
def texts(make_texts: Callable[..., list[str]]) -> list[str]:
    found = make_texts(120, seed=5, max_words=40)
    found[3] = ""  # encodes to no tokens
    found[7] = "doc"  # 3 characters
    return found


@pytest.fixture
def corpus(jsonl_dir: Callable[..., Path], texts: list[str]) -> Path:
    return jsonl_dir(
        {
            "00000.jsonl": [{"text": t} for t in texts[:70]],
            "00001.jsonl.gz": [{"text": t} for t in texts[70:]],
        }
    )


def entries_of(out: Path) -> list:
    ds = open_dataset(out, validate="deep")
    return [(ds[i].tolist(), int(ds.overlap_prefix[i])) for i in range(len(ds))]


def test_entries_follow_the_rule_and_do_not_depend_on_workers(
    tmp_path: Path,
    tiny_tokenizer: Path,
    corpus: Path,
    texts: list[str],
    tree_digest: Callable[[Path], dict[str, str]],
) -> None:
    one = run(tiny_tokenizer, corpus, tmp_path / "w0", seq_len=12, overlap_size=4, min_text_length=5)
    two = run(tiny_tokenizer, corpus, tmp_path / "w2", seq_len=12, overlap_size=4, min_text_length=5, num_workers=2)
    assert tree_digest(tmp_path / "w0") == tree_digest(tmp_path / "w2")
    got = entries_of(tmp_path / "w0")
    assert got == expected_entries(texts, tiny_tokenizer, 12, 4, 5)
    assert max(len(e) for e, _ in got) == 13  # max_length + 1: a last window with its EOD
    assert any(e[-1] != EOD for e, _ in got)  # windows before the last carry no EOD
    assert one.dropped == two.dropped == {"short_text": 2}  # "" and "doc": fewer than 5 characters
    assert one.documents == 120 and one.skipped == {}
    recorded = open_dataset(tmp_path / "w0").metadata["tokenize"]
    assert recorded["settings"]["windowing"] == "gpt-simple" and recorded["settings"]["min_text_length"] == 5
    assert recorded["dropped"] == {"short_text": 2}


def test_tokenloom_rule_is_the_default_and_recorded(tmp_path: Path, tiny_tokenizer: Path, corpus: Path) -> None:
    summary = run(tiny_tokenizer, corpus, tmp_path / "out", seq_len=12, windowing=Windowing.TOKENLOOM)
    got = entries_of(tmp_path / "out")
    assert summary.dropped == {} and len(got) > 120  # the empty document is kept as [EOD]
    assert ([EOD], 0) in got and all(len(e) <= 12 and e[-1] == EOD for e, _ in got)
    assert TokenizeConfig(input_dir=corpus, output_dir=tmp_path / "x").windowing is Windowing.TOKENLOOM
    assert open_dataset(tmp_path / "out").metadata["tokenize"]["settings"]["windowing"] == "tokenloom"


def test_resume_refuses_a_changed_rule_and_names_it(tmp_path: Path, tiny_tokenizer: Path, corpus: Path) -> None:
    run(tiny_tokenizer, corpus, tmp_path / "out", seq_len=12, windowing=Windowing.TOKENLOOM)
    with pytest.raises(ResumeMismatchError, match="windowing 'tokenloom' -> 'gpt-simple'"):
        run(tiny_tokenizer, corpus, tmp_path / "out", seq_len=12)
    run(tiny_tokenizer, corpus, tmp_path / "out", seq_len=12, overwrite=True)
    with pytest.raises(ResumeMismatchError, match="min_text_length 0 -> 200"):
        run(tiny_tokenizer, corpus, tmp_path / "out", seq_len=12, min_text_length=200)


@pytest.mark.parametrize(
    ("files", "match"),
    [
        (
            {"a.jsonl": [{"text": "top"}], "sub/b.jsonl": [{"text": "nested"}]},
            r"sub/b\.jsonl.*reads only INPUT/\*\.jsonl",
        ),
        (
            {"a.jsonl": [{"text": "plain"}], "a.jsonl.gz": [{"text": "gzipped"}]},
            r"a\.jsonl and a\.jsonl\.gz would share one output.*a\.bin/a\.idx",
        ),
    ],
    ids=["in-a-subdirectory", "sharing-an-output-name"],
)
def test_inputs_in_subdirectories_or_sharing_an_output_name_are_refused(
    tmp_path: Path, tiny_tokenizer: Path, jsonl_dir: Callable[..., Path], files: dict, match: str
) -> None:
    corpus = jsonl_dir(files)
    with pytest.raises(ConfigError, match=match):
        run(tiny_tokenizer, corpus, tmp_path / "out", seq_len=8)
    assert not (tmp_path / "out").exists()


def test_an_eod_other_than_gpt_simples_is_refused(tmp_path: Path, tiny_tokenizer: Path, corpus: Path) -> None:
    with pytest.raises(ConfigError, match=r"GPT-Simple ends documents with <\|endoftext\|> = 0.*--eos-id 0"):
        run(tiny_tokenizer, corpus, tmp_path / "out", seq_len=8, eos_id=5)
    word_level = tmp_path / "word"
    word_level.mkdir()
    tokenizer = Tokenizer(models.WordLevel({"<eos>": 0, "<unk>": 1, "doc": 2}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(word_level / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "eos_token": "<eos>"}
    (word_level / "tokenizer_config.json").write_bytes(orjson.dumps(config))
    with pytest.raises(ConfigError, match=r"no <\|endoftext\|> token"):
        run(word_level, corpus, tmp_path / "out2", seq_len=8)


def test_config_refusals() -> None:
    with pytest.raises(ConfigError, match="needs seq_len"):
        TokenizeConfig(input_dir=Path("in"), output_dir=Path("out"), windowing=Windowing.GPT_SIMPLE)
    with pytest.raises(ConfigError, match="applies only to --windowing gpt-simple"):
        TokenizeConfig(input_dir=Path("in"), output_dir=Path("out"), seq_len=8, min_text_length=200)
    with pytest.raises(ConfigError, match="expected one of"):
        TokenizeConfig(input_dir=Path("in"), output_dir=Path("out"), windowing="megatron")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="always reads the field 'text'"):
        TokenizeConfig(
            input_dir=Path("in"),
            output_dir=Path("out"),
            seq_len=8,
            windowing=Windowing.GPT_SIMPLE,
            text_field="body",
        )
    # GPT-Simple accepts an overlap above max_length / 2 (its stride becomes max_length // 2)
    config = TokenizeConfig(
        input_dir=Path("in"), output_dir=Path("out"), seq_len=8, overlap_size=6, windowing=Windowing.GPT_SIMPLE
    )
    assert config.output_settings()["windowing"] == "gpt-simple"


def test_dtype_follows_gpt_simples_threshold() -> None:
    assert gpt_simple_dtype(300) == np.uint16 and gpt_simple_dtype(65_534) == np.uint16
    assert gpt_simple_dtype(65_536) == np.uint32  # tokenloom's own rule would pick uint16 here
    with pytest.raises(ConfigError, match="65,535 ids"):
        gpt_simple_dtype(65_535)


def test_cli_option_and_summary(tmp_path: Path, tiny_tokenizer: Path, corpus: Path) -> None:
    args = ["--input-dir", str(corpus), "--output-dir", str(tmp_path / "out"), "--tokenizer", str(tiny_tokenizer)]
    args += ["--seq-len", "12", "--windowing", "gpt-simple", "--num-workers", "0"]
    result = CliRunner().invoke(tokenize_command, [*args, "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "gpt-simple rule: no_tokens 1 " in result.output  # the empty text
    assert open_dataset(tmp_path / "out").metadata["tokenize"]["settings"]["windowing"] == "gpt-simple"


LINES = (
    b'{"text": "alpha beta", "score": NaN}\r\n'  # NaN: json.loads only; a \r\n ending
    b'\x0c{"text": "gamma delta", "x": -Infinity}\x0c\n'  # form feeds: stripped by str.strip() only
    b'\xc2\xa0{"text": "epsilon"}\xc2\xa0\n'  # U+00A0
    b"\n"
    b"  \xc2\xa0\x0c\n"  # blank after str.strip()
    b'{"title": "no text"}\n'
    b'{"text": "zeta eta"}\r'  # a \r right before the end of the file: harmless
)
LINE_TEXTS = ["alpha beta", "gamma delta", "epsilon", "zeta eta"]


def test_lines_are_read_as_gpt_simple_reads_them(
    tmp_path: Path, tiny_tokenizer: Path, jsonl_dir: Callable[..., Path]
) -> None:
    corpus = jsonl_dir({}, raw={"a.jsonl": LINES})
    summary = run(tiny_tokenizer, corpus, tmp_path / "out", seq_len=4, overlap_size=1)
    assert entries_of(tmp_path / "out") == expected_entries(LINE_TEXTS, tiny_tokenizer, 4, 1, 0)
    assert summary.dropped == {"blank_line": 2, "no_text_field": 1}
    assert summary.skipped == {}
    assert open_dataset(tmp_path / "out").metadata["tokenize"]["dropped"] == summary.dropped
    # the tokenloom rule reads strict JSON: the same file stops at its first line
    with pytest.raises(RecordError, match="not valid JSON"):
        run(tiny_tokenizer, corpus, tmp_path / "strict", seq_len=4, windowing=Windowing.TOKENLOOM)


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        (b'{"text": "a",}', "malformed_json"),  # json.loads rejects it too (GPT-Simple skips it)
        (b'{"text": 5}', "non_string_field"),  # GPT-Simple's pretokenize fails on these
        (b'{"text": NaN}', "non_string_field"),
        (b"[1, 2]", "not_an_object"),
        (b'{"text": "a\\ud800b"}', "malformed_json"),  # json.loads accepts the lone surrogate; no tokenizer does
    ],
)
def test_lines_gpt_simple_cannot_use_are_bad_records(
    tmp_path: Path, tiny_tokenizer: Path, jsonl_dir: Callable[..., Path], line: bytes, kind: str
) -> None:
    corpus = jsonl_dir({}, raw={"a.jsonl": b'{"text": "fine"}\n' + line + b"\n"})
    with pytest.raises(RecordError) as caught:
        run(tiny_tokenizer, corpus, tmp_path / "out", seq_len=4)
    assert caught.value.record == 2 and caught.value.field == kind
    summary = run(tiny_tokenizer, corpus, tmp_path / "skip", seq_len=4, on_error="skip")
    assert summary.skipped == {kind: 1} and summary.documents == 1


@pytest.mark.parametrize(
    "line",
    [
        b'{"text": "one"}\r{"text": "two"}',  # GPT-Simple reads two records here
        b'{"text":\r"one"}',  # valid JSON for orjson; GPT-Simple reads two broken lines
    ],
)
def test_a_bare_carriage_return_is_refused(
    tmp_path: Path, tiny_tokenizer: Path, jsonl_dir: Callable[..., Path], line: bytes
) -> None:
    corpus = jsonl_dir({}, raw={"a.jsonl": b'{"text": "fine"}\r\n' + line + b"\r\n"})
    with pytest.raises(RecordError, match=r"bare carriage return.*text mode") as caught:
        run(tiny_tokenizer, corpus, tmp_path / "out", seq_len=4, on_error="skip")
    assert caught.value.record == 2 and str(caught.value.path).endswith("a.jsonl")
    run(tiny_tokenizer, corpus, tmp_path / "ours", seq_len=4, windowing=Windowing.TOKENLOOM, on_error="skip")


def test_a_literal_pad_token_is_refused_unless_the_tokenizer_has_it(
    tmp_path: Path, tiny_tokenizer: Path, jsonl_dir: Callable[..., Path]
) -> None:
    corpus = jsonl_dir({"a.jsonl": [{"text": "plain"}, {"text": "with <|pad|> inside"}]})
    with pytest.raises(RecordError, match=r"<\|pad\|>.*one new id") as caught:
        run(tiny_tokenizer, corpus, tmp_path / "out", seq_len=8, on_error="skip")
    assert caught.value.record == 2 and str(caught.value.path).endswith("a.jsonl")
    # the tokenloom rule is not GPT-Simple's: the text is ordinary there
    run(tiny_tokenizer, corpus, tmp_path / "ours", seq_len=8, windowing=Windowing.TOKENLOOM)
    # a tokenizer that has <|pad|> as an added token encodes it as GPT-Simple does: one id, its own
    with_pad = tmp_path / "with-pad"
    with_pad.mkdir()
    for name in tiny_tokenizer.iterdir():
        (with_pad / name.name).write_bytes(name.read_bytes())
    tok = Tokenizer.from_file(str(tiny_tokenizer / "tokenizer.json"))
    tok.add_special_tokens(["<|pad|>"])
    tok.save(str(with_pad / "tokenizer.json"))
    pad_id = tok.token_to_id("<|pad|>")
    run(with_pad, corpus, tmp_path / "padded", seq_len=32)
    assert sum(tokens.count(pad_id) for tokens, _ in entries_of(tmp_path / "padded")) == 1
