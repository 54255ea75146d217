"""The README's eval example runs as written, launched the way it says (torchrun, 2 gloo ranks) (#21)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def eval_example() -> str:
    text = README.read_text()
    section = text[text.index("## Example: a training loop's eval") :]
    match = re.search(r"```python\n(.*?)```\n", section, re.DOTALL)
    assert match is not None, "the eval example's python block is missing"
    return match.group(1)


def test_the_readme_eval_example_runs_under_the_torchrun_command_it_names(tmp_path):
    pytest.importorskip("datasets")
    pytest.importorskip("transformers")
    pytest.importorskip("tokenloom.tokenize")
    code = eval_example()
    launch = re.search(r"^#\s+(torchrun .*)$", code, re.MULTILINE)
    assert launch is not None, "the example does not say how to launch it"
    argv = shlex.split(launch.group(1))
    script = argv[-1]
    (tmp_path / script).write_text(code)  # the file name the comment gives
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", *argv[1:]],  # torchrun, from this environment
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("rank "))
    nproc = int(next(a.split("=", 1)[1] for a in argv if a.startswith("--nproc-per-node=")))
    assert len(lines) == nproc == 2, result.stdout
    losses = {line.split("eval loss ")[1] for line in lines}
    assert len(losses) == 1, lines  # token_weighted_mean: one number on every rank
