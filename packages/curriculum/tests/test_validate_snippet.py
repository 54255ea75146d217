"""`tokenloom validate` on a bucket prints a curriculum data block the config loader accepts as printed."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from tokenloom.curriculum import CurriculumConfig
from tokenloom.formats import open_writer
from tokenloom.formats.cli.commands import validate


def test_the_printed_curriculum_block_is_accepted_as_printed(tmp_path: Path) -> None:
    root = tmp_path / "data"
    for split, bucket in ((s, b) for s in ("train", "val") for b in ("web", "code")):
        with open_writer(root / split / bucket, format="native", dtype="uint16", vocab_size=100, eos_id=0) as w:
            for n in range(1, 40):
                w.add([1 + n % 90] * n + [0])
    result = CliRunner().invoke(validate, [str(root / "train" / "web"), "--seq-len", "16"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# curriculum config, read by tokenloom-curr"))
    block = "\n".join(lines[start:]) + "\n"
    config_file = tmp_path / "curriculum.yaml"
    config_file.write_text(block)
    config = CurriculumConfig.from_file(config_file)  # unknown keys would be a ConfigError
    assert config.path == root.resolve() and config.seq_len == 16 and config.packing is False
    checked = CliRunner().invoke(validate, ["--curriculum", str(config_file)])
    assert checked.exit_code in (0, 2), checked.output  # 2: warnings only
