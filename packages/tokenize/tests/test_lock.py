"""Two tokenize processes into one output: the second is refused naming the first (issue #11)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tokenloom.formats import open_dataset
from tokenloom.formats.io import lock_path

SLOW_RUN = """
import sys, time
from tokenloom.tokenize import TokenizeConfig
from tokenloom.tokenize._tokenize import tokenize
config = TokenizeConfig(input_dir=sys.argv[1], output_dir=sys.argv[2], tokenizer=sys.argv[3], num_workers=0,
                        chunk_lines=20)
summary = tokenize(config, on_progress=lambda *_: time.sleep(0.3))
print("entries", summary.entries)
"""


def test_second_tokenize_into_the_same_output_is_refused(
    tmp_path: Path, tiny_tokenizer: Path, text_corpus: Callable[[int], Path], make_texts: Callable[..., list[str]]
) -> None:
    corpus = text_corpus(200)
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    first = subprocess.Popen(
        [sys.executable, "-c", SLOW_RUN, str(corpus), str(out), str(tiny_tokenizer)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not lock_path(out).exists():
            assert time.monotonic() < deadline and first.poll() is None, first.stderr and first.stderr.read()
            time.sleep(0.05)
        second = subprocess.run(
            [sys.executable, "-c", "from tokenloom.formats.cli.group import main; main()", "tokenize", "--input-dir",
             str(corpus), "--output-dir", str(out), "--tokenizer", str(tiny_tokenizer), "--num-workers", "0",
             "--no-progress"],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
        assert second.returncode == 1, second.stderr
        assert "OutputLockedError" in second.stderr and f"pid {first.pid}" in second.stderr
        assert "Traceback" not in second.stderr
        stdout, stderr = first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, stderr
    assert stdout.startswith("entries 200")
    assert len(open_dataset(out)) == 200
    assert not lock_path(out).exists()
