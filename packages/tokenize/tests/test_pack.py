"""tokenloom pack: one jsonl file -> a Modalities .pbin via the formats packed writer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from tokenizers import Tokenizer

from tokenloom.formats import ConfigError, RecordError, open_dataset
from tokenloom.tokenize import default_pack_path, pack
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
