"""Outputs of the single-process layout before the one pipeline (shard_NNNNN.bin/.idx) still open and validate.

tests/data/old_layout_native was written by ``tokenize`` at 89f6462 (70 documents, max_length 64, 3 shards),
the last commit with that layout; tokenize now writes unit shards (unit_UUUUUU_KKKK) in every mode.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from tokenloom.formats import ResumeMismatchError, open_dataset
from tokenloom.formats.cli.commands import validate
from tokenloom.tokenize import TokenizeConfig, tokenize

OLD = Path(__file__).parent / "data" / "old_layout_native"


def test_an_old_layout_dataset_opens_and_validates_deep() -> None:
    dataset = open_dataset(OLD, validate="deep")
    assert (len(dataset), dataset.num_tokens, dataset.num_shards) == (136, 6590, 3)
    assert dataset.eos_id == 0 and dataset[0][-1] == 0
    result = CliRunner().invoke(validate, [str(OLD), "--deep"])
    assert result.exit_code == 0, result.output


def test_tokenize_into_an_old_layout_dataset_needs_overwrite(
    tmp_path: Path, tiny_tokenizer: Path, text_corpus: Callable[[int], Path]
) -> None:
    corpus = text_corpus(50)
    out = tmp_path / "old"
    shutil.copytree(OLD, out)
    config = TokenizeConfig(input_dir=corpus, output_dir=out, tokenizer=str(tiny_tokenizer), num_workers=0)
    with pytest.raises(ResumeMismatchError, match="--overwrite"):
        tokenize(config)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in OLD.iterdir())  # nothing touched
    summary = tokenize(dataclasses.replace(config, overwrite=True))
    assert summary.documents == 50
    assert not list(out.glob("shard_*")) and list(out.glob("unit_000000_0000.*"))
