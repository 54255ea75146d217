"""`tokenloom validate` prints Python that tokenloom-datasets runs as printed (issue 21)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from tokenloom.formats import open_writer
from tokenloom.formats.cli.commands import validate


def _python_snippet(output: str) -> tuple[str, int]:
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# Python, read by tokenloom-datasets"))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("# len(windows) == "))
    expected = int(lines[end].removeprefix("# len(windows) == ").split(":")[0])
    return "\n".join(lines[start : end + 1]), expected


def test_the_printed_snippet_builds_the_windows_it_announces(tmp_path: Path) -> None:
    root = tmp_path / "tokens"
    with open_writer(root, format="native", dtype="uint16", vocab_size=100, eos_id=0, shard_size_tokens=40) as w:
        for n in range(1, 30):
            w.add([1 + n % 90] * n + [0])
    result = CliRunner().invoke(validate, [str(root), "--seq-len", "7"])
    assert result.exit_code == 0, result.output
    snippet, expected = _python_snippet(result.output)
    assert "MemoryMappedDataset" in snippet and "tokenloom-datasets" in snippet.splitlines()[0]
    scope: dict[str, object] = {}
    exec(compile(snippet, "<validate snippet>", "exec"), scope)
    windows = scope["windows"]
    assert len(windows) == expected > 0  # type: ignore[arg-type]
    assert windows[0]["input_ids"].shape == (7,)  # type: ignore[index]
