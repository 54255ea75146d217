"""Review 2: `tokenize --max-length` is gone (`--seq-len` only). A script still passing the old flag should be
told the new name; click's own guess points at options of another meaning."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tokenloom.tokenize._commands import tokenize


@pytest.mark.xfail(
    strict=True,
    reason="tokenize/_commands.py (click's unknown-option guess): `tokenize ... --train-type sft --max-length 8` "
    "exits 2 with \"No such option '--max-length'. (Did you mean one of: '--max-line-bytes', "
    "'--min-text-length'?)\" -- it never names --seq-len, and following its first guess sets a line-byte cap "
    "of 8; expected the usage error to name --seq-len (CHANGELOG: 'Scripts that passed --max-length pass --seq-len')",
)
def test_the_removed_max_length_flag_points_at_seq_len(tmp_path):
    args = ["--input-dir", str(tmp_path), "--output-dir", str(tmp_path / "o"), "--train-type", "sft"]
    result = CliRunner().invoke(tokenize, [*args, "--max-length", "8"])
    assert result.exit_code == 2
    assert "--seq-len" in result.output


def test_seq_len_is_accepted_by_the_parser(tmp_path):
    result = CliRunner().invoke(tokenize, ["--help"])
    assert "--seq-len" in result.output and "--max-length" not in result.output
