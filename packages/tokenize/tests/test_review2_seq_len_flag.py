"""Review 2: `tokenize --max-length` is gone (`--seq-len` only; nothing was released, so no old-name hint)."""

from __future__ import annotations

from click.testing import CliRunner

from tokenloom.tokenize._commands import tokenize


def test_seq_len_is_accepted_by_the_parser(tmp_path):
    result = CliRunner().invoke(tokenize, ["--help"])
    assert "--seq-len" in result.output and "--max-length" not in result.output
