"""Review of issue 36's one unit executor (_unit_work.run_unit_tasks) for --train-type record units.

Attack: a `--num-workers 2` sft run SIGKILLed at a random unit count and rerun (resume by unit markers)
gives the uninterrupted run's bytes (bad records and damaged units: test_review_record_units.py).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from tokenloom.formats import FormatError, open_records
from tokenloom.tokenize._commands import tokenize as tokenize_command
from tokenloom.tokenize.chat import SIDECAR_NAME

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses SIGKILL and process groups")


def sft_record(i: int) -> dict:
    if i % 3 == 0:
        return {"prompt": f"what is {i}?", "completion": f"it is {i} " + "and more " * (i % 5)}
    return {
        "messages": [
            {"role": "user", "content": f"question {i}: ünïcode ✓"},
            {"role": "assistant", "content": f"answer {i} " + "word " * (i % 7)},
        ]
    }


def _lines(records: list[dict]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


def run_cli(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(tokenize_command, [str(a) for a in args] + ["--no-progress"])
    return result.exit_code, result.output


def store_bytes(out: Path) -> dict[str, bytes]:
    names = [*sorted(p.name for p in out.iterdir() if p.suffix == ".bin"), SIDECAR_NAME, "meta.json"]
    return {name: (out / name).read_bytes() for name in names}


def _done(out: Path) -> int:
    return len(list(out.glob(".tokenloom-unit-*.done"))) if out.is_dir() else 0


def _kill_after(cmd: list[str], out: Path, units: int) -> int:
    victim = subprocess.Popen(cmd, start_new_session=True, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while _done(out) < units:
        if victim.poll() is not None:
            pytest.fail(f"the run ended before it could be killed: {victim.stderr.read().decode()[-1500:]}")  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.005)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(timeout=10)
    return _done(out)


def test_sft_with_two_workers_killed_mid_run_then_rerun_is_byte_identical(tmp_path: Path, chat_tokenizer_dir) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    tok = chat_tokenizer_dir("chatml")
    (tmp_path / "in").mkdir()
    records = [sft_record(i) for i in range(1200)]
    (tmp_path / "in" / "a.jsonl").write_bytes(_lines(records[:700]))
    (tmp_path / "in" / "b.jsonl").write_bytes(_lines(records[700:]))
    args = ["--input-dir", tmp_path / "in", "--train-type", "sft", "--tokenizer", tok, "--unit-bytes", 6000]
    args = [*map(str, args), "--num-workers", "2", "--no-progress"]
    code, output = run_cli(*args, "--output-dir", tmp_path / "clean")
    assert code == 0, output
    units = len(orjson.loads((tmp_path / "clean" / ".tokenloom-plan.json").read_bytes())["units"])
    assert units >= 12
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "tokenloom.formats", "tokenize", *args, "--output-dir", str(out)]
    first = _kill_after(cmd, out, rng.randint(2, units // 2))  # once (each kill costs a start of the CLI)
    assert 0 < first < units and not (out / "meta.json").exists(), f"seed {seed}"
    with pytest.raises(FormatError, match="tokenloom-writing"):
        open_records(out)
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert store_bytes(out) == store_bytes(tmp_path / "clean"), f"seed {seed}: killed after {first} units"
    assert len(open_records(out)) == 1200
    assert not [p.name for p in out.iterdir() if p.name.startswith(("unit_", ".tokenloom-unit-"))]
