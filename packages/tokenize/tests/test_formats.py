"""--format megatron / flat / packed: native staging, conversion, crash-safe publish."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from click.testing import CliRunner
from tokenize_helpers import make_texts, tree_digest
from tokenizers import Tokenizer, models, pre_tokenizers

from tokenloom.formats import ConfigError, DataError, ResumeMismatchError, open_dataset, read_manifest
from tokenloom.formats.io import WRITING_MARKER
from tokenloom.tokenize import RECORD_NAME, TokenizeConfig, output_path, staging_dir, tokenize
from tokenloom.tokenize._commands import tokenize as tokenize_command

FORMATS = ("megatron", "flat", "packed")


def config(tokenizer: Path, input_dir: Path, out: Path, **kw: Any) -> TokenizeConfig:
    options: dict[str, Any] = {"num_workers": 0, "shard_size_tokens": 2000, "seq_len": 32, "chunk_lines": 37}
    options.update(kw)
    return TokenizeConfig(input_dir=input_dir, output_dir=out, tokenizer=str(tokenizer), **options)


@pytest.fixture
def corpus(jsonl_dir: Callable[..., Path]) -> Path:
    texts = make_texts(400, seed=3)
    texts[5] = ""  # an empty document is one entry of just EOD
    return jsonl_dir({"a.jsonl": [{"text": t} for t in texts[:150]], "b.jsonl.gz": [{"text": t} for t in texts[150:]]})


def _entries(path: Path) -> list[list[int]]:
    ds = open_dataset(path, validate="deep")
    return [ds[i].tolist() for i in range(len(ds))]


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_round_trips_to_the_native_result(
    tmp_path: Path, tiny_tokenizer: Path, corpus: Path, fmt: str
) -> None:
    native = tokenize(config(tiny_tokenizer, corpus, tmp_path / "native"))
    out = tmp_path / fmt
    summary = tokenize(config(tiny_tokenizer, corpus, out, format=fmt))
    assert summary.format == fmt and summary.tokens == native.tokens and summary.entries == native.entries
    assert summary.documents == 400 and summary.dtype == "uint16" and summary.eos_id == 0
    summary_config = config(tiny_tokenizer, corpus, out, format=fmt)
    assert _entries(output_path(summary_config)) == _entries(tmp_path / "native")
    assert _entries(out) == _entries(tmp_path / "native")  # OUT itself is detected too
    assert not staging_dir(out).exists() and not (out / WRITING_MARKER).exists()
    if fmt == "flat":
        manifest = read_manifest(out)
        record = manifest.metadata["tokenize"]
        assert manifest.tokenizer_fingerprint == record["tokenizer_fingerprint"]
        assert summary.shards == len(manifest.metadata["flat"]["shard_entries"]) > 1  # --shard-size-tokens honoured
    else:
        record = orjson.loads((out / RECORD_NAME).read_bytes())
        assert record["num_tokens"] == native.tokens and record["eos_id"] == 0 and record["vocab_size"] == 300
    assert record["settings"] == summary_config.output_settings()
    assert record["settings"]["format"] == fmt and len(record["inputs"]) == 2
    again = tokenize(summary_config)
    assert again.already_complete and again.tokens == summary.tokens and again.shards == summary.shards


@pytest.mark.parametrize("fmt", FORMATS)
def test_worker_counts_give_identical_bytes(
    tmp_path: Path,
    tiny_tokenizer: Path,
    corpus: Path,
    fmt: str,
) -> None:
    digests = []
    for workers in (0, 2):
        out = tmp_path / f"{fmt}-{workers}"
        tokenize(config(tiny_tokenizer, corpus, out, format=fmt, num_workers=workers, chunk_lines=11 + workers))
        digests.append(tree_digest(out))
    assert digests[0] == digests[1]


def test_overlap_is_refused_unless_dropped_on_request(tmp_path: Path, tiny_tokenizer: Path, corpus: Path) -> None:
    for fmt in FORMATS:
        with pytest.raises(ConfigError, match="overlap") as err:
            config(tiny_tokenizer, corpus, tmp_path / "o", format=fmt, overlap_size=8)
        assert err.value.field == "overlap_size" and "--drop-overlap-prefix" in str(err.value)
    with pytest.raises(ConfigError, match="drop_overlap_prefix"):
        config(tiny_tokenizer, corpus, tmp_path / "o", drop_overlap_prefix=True)
    native = tmp_path / "native"
    tokenize(config(tiny_tokenizer, corpus, native, overlap_size=8))
    out = tmp_path / "megatron"
    tokenize(config(tiny_tokenizer, corpus, out, format="megatron", overlap_size=8, drop_overlap_prefix=True))
    assert _entries(out) == _entries(native)
    assert open_dataset(native).overlap_prefix.any() and not open_dataset(out).overlap_prefix.any()


def test_cli_refuses_overlap_and_writes_megatron(tmp_path: Path, tiny_tokenizer: Path, corpus: Path) -> None:
    args = ["--input-dir", str(corpus), "--output-dir", str(tmp_path / "out"), "--tokenizer", str(tiny_tokenizer)]
    args += ["--num-workers", "0", "--no-progress", "--format", "megatron", "--seq-len", "32"]
    refused = CliRunner().invoke(tokenize_command, [*args, "--overlap-size", "8"])
    assert refused.exit_code == 1 and "ConfigError" in refused.output and "overlap_size" in refused.output
    assert not (tmp_path / "out").exists() and not staging_dir(tmp_path / "out").exists()
    result = CliRunner().invoke(tokenize_command, args)
    assert result.exit_code == 0, result.output
    assert "(megatron)" in result.output
    # data.tokenloom.json: the EOS id, vocab size and tokenizer that Megatron's .idx has no field for
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "data.bin",
        "data.idx",
        "data.tokenloom.json",
        RECORD_NAME,
    ]
    assert "--drop-overlap-prefix" in CliRunner().invoke(tokenize_command, ["--help"]).output


def test_keep_staging(tmp_path: Path, tiny_tokenizer: Path, corpus: Path) -> None:
    out = tmp_path / "out"
    tokenize(config(tiny_tokenizer, corpus, out, format="packed", keep_staging=True))
    assert _entries(staging_dir(out)) == _entries(out)
    tokenize(config(tiny_tokenizer, corpus, out, format="packed"))  # complete: the rerun removes the staging
    assert not staging_dir(out).exists()


@pytest.mark.parametrize("fmt", FORMATS)
def test_rerun_after_a_crash_during_publish_is_byte_identical(
    tmp_path: Path,
    tiny_tokenizer: Path,
    corpus: Path,
    fmt: str,
) -> None:
    """What a kill during conversion leaves: marker, no record, temp and half-published files, staging."""
    whole = tmp_path / "whole"
    tokenize(config(tiny_tokenizer, corpus, whole, format=fmt))
    out = tmp_path / "out"
    tokenize(config(tiny_tokenizer, corpus, out, format=fmt, keep_staging=True))
    (out / WRITING_MARKER).touch()
    for name in (RECORD_NAME, "manifest.json"):
        (out / name).unlink(missing_ok=True)
    victim = sorted(p for p in out.iterdir() if p.name != WRITING_MARKER)[0]
    victim.with_name(victim.name + ".tmp").write_bytes(b"half")
    victim.write_bytes(victim.read_bytes()[:10])
    with pytest.raises(DataError):
        open_dataset(out)
    tokenize(config(tiny_tokenizer, corpus, out, format=fmt))
    assert tree_digest(out) == tree_digest(whole)
    assert not staging_dir(out).exists()


def test_other_settings_and_foreign_files_need_overwrite(tmp_path: Path, tiny_tokenizer: Path, corpus: Path) -> None:
    out = tmp_path / "out"
    tokenize(config(tiny_tokenizer, corpus, out, format="megatron"))
    with pytest.raises(ResumeMismatchError):
        tokenize(config(tiny_tokenizer, corpus, out, format="megatron", seq_len=16))
    summary = tokenize(config(tiny_tokenizer, corpus, out, format="megatron", seq_len=16, overwrite=True))
    assert not summary.already_complete
    assert max(len(e) for e in _entries(out)) == 16
    tokenize(config(tiny_tokenizer, corpus, out, overwrite=True))  # native over megatron
    tokenize(config(tiny_tokenizer, corpus, out, format="packed", overwrite=True))  # and packed over native
    assert sorted(p.name for p in out.iterdir()) == ["data.pbin", "data.pbin.tokenloom.json", RECORD_NAME]
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="notes.txt"):
        tokenize(config(tiny_tokenizer, corpus, other, format="packed"))
    assert not staging_dir(other).exists()


def test_uint32_vocab_is_int32_in_megatron(tmp_path: Path, jsonl_dir: Callable[..., Path]) -> None:
    vocab = {"<eos>": 0, "<unk>": 1, **{f"w{i}": i for i in range(2, 70_000)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = tmp_path / "big-tok"
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "eos_token": "<eos>"}
    (path / "tokenizer_config.json").write_bytes(orjson.dumps(settings))
    corpus = jsonl_dir({"a.jsonl": [{"text": "w5 w65999 w69000"}]})
    out = tmp_path / "out"
    summary = tokenize(config(path, corpus, out, format="megatron"))
    assert summary.dtype == "int32"
    ds = open_dataset(out)
    assert ds[0].tolist() == [5, 65_999, 69_000, 0] and np.dtype(ds.dtype) == np.int32


@pytest.mark.parametrize("fmt", FORMATS)
def test_two_nodes_give_the_bytes_of_one_process(tmp_path: Path, tiny_tokenizer: Path, corpus: Path, fmt: str) -> None:
    """The units are staged natively by every node; the node that finalizes the staging run converts."""
    single = tmp_path / "single"
    tokenize(config(tiny_tokenizer, corpus, single, format=fmt))
    out = tmp_path / "nodes"
    first = tokenize(config(tiny_tokenizer, corpus, out, format=fmt, num_nodes=2, node_rank=1))
    assert first.units_missing == 1 and not out.exists() and staging_dir(out).is_dir()
    last = tokenize(config(tiny_tokenizer, corpus, out, format=fmt, num_nodes=2, node_rank=0))
    assert last.units_missing == 0 and last.format == fmt and last.documents == 400
    assert tree_digest(out) == tree_digest(single) and not staging_dir(out).exists()
