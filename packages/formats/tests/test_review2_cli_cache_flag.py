"""Review 2: the formats CLI's `--cache-dir` became `--block-cache-dir` (no alias). The old flag is a usage error
that points at the new name; the new one on a local path is refused by name."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tokenloom.formats.cli.group import main


@pytest.mark.parametrize("command", ["validate", "inspect"])
def test_the_old_flag_names_the_new_one(tmp_path, command):
    result = CliRunner().invoke(main, [command, str(tmp_path), "--cache-dir", str(tmp_path / "c")])
    assert result.exit_code == 2
    assert "--block-cache-dir" in result.output


def test_block_cache_dir_on_a_local_path_is_refused_by_name(tmp_path):
    result = CliRunner().invoke(main, ["validate", str(tmp_path), "--block-cache-dir", str(tmp_path / "c")])
    assert result.exit_code != 0
    assert "--block-cache-dir" in result.output
    assert not (tmp_path / "c").exists()
