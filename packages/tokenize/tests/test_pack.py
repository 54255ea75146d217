"""tokenloom pack: one jsonl file -> a Modalities .pbin via the formats packed writer."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from tokenizers import Tokenizer

from tokenloom.formats import ConfigError, RecordError, open_dataset
from tokenloom.tokenize import TokenizeConfig, default_pack_path, pack, tokenize
from tokenloom.tokenize._commands import pack as pack_command


def test_pack_writes_documents_plus_eod_in_order(
    tmp_path: Path, tiny_tokenizer: Path, jsonl_dir: Callable[..., Path]
) -> None:
    texts = ["alpha beta", "", "gamma delta epsilon"]
    corpus = jsonl_dir({"train.jsonl": [{"text": t} for t in texts]})
    tok = Tokenizer.from_file(str(tiny_tokenizer / "tokenizer.json"))
    for engine in ("hf", "auto"):
        output = tmp_path / f"{engine}.pbin"
        summary = pack(corpus / "train.jsonl", output, tokenizer=str(tiny_tokenizer), num_workers=0, engine=engine)
        assert summary.output == output and summary.documents == 3
        assert summary.engine == ("hf" if engine == "hf" else "fast")
        ds = open_dataset(summary.output)
        assert [ds[i].tolist() for i in range(len(ds))] == [
            [*tok.encode(t, add_special_tokens=False).ids, 0] for t in texts
        ]
    assert (tmp_path / "hf.pbin").read_bytes() == (tmp_path / "auto.pbin").read_bytes()
    summary = pack(corpus / "train.jsonl", tokenizer=str(tiny_tokenizer), num_workers=0)
    assert summary.output == corpus / "train.pbin"
    with pytest.raises(ConfigError, match="exists"):
        pack(corpus / "train.jsonl", tokenizer=str(tiny_tokenizer), num_workers=0)


def test_pack_bad_record_raises_and_leaves_no_file(
    tmp_path: Path, tiny_tokenizer: Path, jsonl_dir: Callable[..., Path]
) -> None:
    corpus = jsonl_dir({}, raw={"t.jsonl.gz": b""})
    (corpus / "t.jsonl").write_bytes(b'{"text": "ok"}\n{"text": 1}\n')
    with pytest.raises(RecordError) as info:
        pack(corpus / "t.jsonl", tokenizer=str(tiny_tokenizer), num_workers=0)
    assert info.value.record == 2 and not (corpus / "t.pbin").exists()
    assert not list(corpus.glob("*.tmp"))
    summary = pack(
        corpus / "t.jsonl", tmp_path / "o.pbin", tokenizer=str(tiny_tokenizer), num_workers=0, on_error="skip"
    )
    assert summary.skipped == {"non_string_field": 1} and len(open_dataset(tmp_path / "o.pbin")) == 1


def test_default_path_and_cli(tmp_path: Path, tiny_tokenizer: Path, jsonl_dir: Callable[..., Path]) -> None:
    assert default_pack_path("a/b.jsonl.gz") == Path("a/b.pbin")
    corpus = jsonl_dir({"c.jsonl": [{"text": "one"}, {"text": "two"}]})
    help_text = CliRunner().invoke(pack_command, ["--help"]).output
    assert "Example:" in help_text
    result = CliRunner().invoke(
        pack_command, [str(corpus / "c.jsonl"), "--tokenizer", str(tiny_tokenizer), "--num-workers", "0", "--legacy"]
    )
    assert result.exit_code == 0, result.output
    assert "2 documents" in result.output and len(open_dataset(corpus / "c.pbin")) == 2


@pytest.mark.parametrize("damage", ["truncated-json", "not-a-tokenizer"])
def test_pack_with_a_corrupt_tokenizer_is_one_named_line(
    tmp_path: Path, tiny_tokenizer: Path, jsonl_dir: Callable[..., Path], damage: str
) -> None:
    """Found by tools/fuzz/catalogue.py: pack raised a bare JSONDecodeError on a truncated tokenizer.json."""
    import shutil

    corpus = jsonl_dir({"train.jsonl": [{"text": "alpha beta"}]})
    broken = tmp_path / "broken-tok"
    shutil.copytree(tiny_tokenizer, broken)
    if damage == "truncated-json":
        (broken / "tokenizer.json").write_bytes((broken / "tokenizer.json").read_bytes()[:40])
    else:
        (broken / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nonsense"}}')
    args = [str(corpus / "train.jsonl"), "--output", str(tmp_path / "o.pbin"), "--tokenizer", str(broken)]
    result = CliRunner().invoke(pack_command, [*args, "--num-workers", "0", "--no-progress"])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: ConfigError: ") and len(result.output.strip().splitlines()) == 1
    assert ("not valid JSON" if damage == "truncated-json" else "cannot load this tokenizer.json") in result.output
    assert not (tmp_path / "o.pbin").exists()


#: sha256 of the .pbin ``pack`` wrote for ``_fixed_corpus`` with the shipped tokenizer before it ran through the
#: unit pipeline (its own encode loop, commit 479a23c): the fold keeps the bytes.
PACKED_SHA256 = {
    False: "42963aa74ed68cf88c6369fdb348a5432e013b15e56550f764e27d7c43f5be87",
    True: "f109aff628a2b2fadb097fe8e8036ae5f836d4a2e1203aa1f5d366b16851723a",
}


def _fixed_corpus(path: Path) -> Path:
    words = ["alpha", "beta", "gamma", "délta", "εψ", "中文", "x" * 30, "", "  ", "\n"]
    lines = []
    for i in range(600):
        text = " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(i % 37))
        lines.append(orjson.dumps({"text": text}))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.mark.parametrize("legacy", [False, True])
def test_pack_bytes_are_kept(tmp_path: Path, legacy: bool) -> None:
    source = _fixed_corpus(tmp_path / "train.jsonl")
    summary = pack(source, legacy=legacy, num_workers=0, chunk_lines=64)
    assert summary.output == tmp_path / "train.pbin" and summary.documents == 600
    assert hashlib.sha256(summary.output.read_bytes()).hexdigest() == PACKED_SHA256[legacy]


def test_pack_gives_the_bytes_of_tokenize_format_packed(tmp_path: Path) -> None:
    source = _fixed_corpus(tmp_path / "in" / "train.jsonl")
    packed = pack(source, tmp_path / "p.pbin", num_workers=0)
    tokenize(TokenizeConfig(input_dir=source.parent, output_dir=tmp_path / "out", format="packed", num_workers=0))
    assert (tmp_path / "out" / "data.pbin").read_bytes() == packed.output.read_bytes()


def test_pack_to_a_name_that_is_not_pbin_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    source = _fixed_corpus(tmp_path / "train.jsonl")
    with pytest.raises(ConfigError, match=r"does not end in \.pbin"):
        pack(source, tmp_path / "train.bin", num_workers=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.jsonl"]
