"""Catalogue rows for wave 3's correctness issue (#21): the tokenize items that are an input or a fault."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _catalogue_base import Outcome, Run, _tokenizer, case


def _corpus(directory: Path, documents: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    lines = (json.dumps({"text": f"document {i}: " + "alpha beta gamma " * (1 + i % 13)}) for i in range(documents))
    (directory / "a.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return directory


@case("tokenize: an input whose file name is not valid UTF-8", "bad input", "error", "UnsafePathError")
def _(tmp: Path) -> Run:
    inputs = _corpus(tmp / "in", 5)
    (Path(os.fsdecode(bytes(inputs))) / os.fsdecode(b"caf\xe9.jsonl")).write_bytes(b'{"text": "x"}\n')
    out = tmp / "out"

    def check(_outcome: Outcome) -> str | None:
        return f"{out} was left behind" if out.exists() else None

    argv = ["tokenize", "--input-dir", str(inputs), "--output-dir", str(out), "--num-workers", "0", "--no-progress"]
    return Run(argv=argv, check=check)


@case("tokenize: an encoding worker SIGKILLed (as by the OOM killer)", "faults", "error", "WorkerDiedError")
def _(tmp: Path) -> Run:
    import multiprocessing

    from tokenloom.tokenize import TokenizeConfig, tokenize

    inputs = _corpus(tmp / "in", 3000)
    out = tmp / "out"
    config = TokenizeConfig(
        input_dir=inputs,
        output_dir=out,
        tokenizer=str(_tokenizer()),
        num_workers=2,
        chunk_lines=100,
        shard_size_tokens=20_000,
        unit_bytes=max(1, sum(p.stat().st_size for p in inputs.rglob("*.jsonl")) // 6),  # units to resume after
    )
    killed: list[int] = []

    def kill_a_worker(_documents: int, _tokens: int, _bytes: int) -> None:
        workers = [
            p for p in multiprocessing.active_children() if p.name.startswith(("SpawnProcess", "ForkServerProcess"))
        ]
        if not killed and workers and len(list(out.glob(".tokenloom-unit-*.done"))) >= 1:
            os.kill(workers[0].pid, signal.SIGKILL)  # type: ignore[arg-type]
            killed.append(workers[0].pid)  # type: ignore[arg-type]

    def check(outcome: Outcome) -> str | None:
        message = str(outcome.exception)
        if "SIGKILL" not in message or "a.jsonl" not in message:
            return f"the error does not name the signal and the file: {message[:160]}"
        try:
            resumed = tokenize(config)
        except Exception as exc:  # the row reports what a rerun raised
            return f"the rerun failed: {exc!r}"[:200]
        return None if resumed.resumed_units >= 1 else "the rerun did not resume"

    return Run(call=lambda: tokenize(config, on_progress=kill_a_worker), check=check)


_KILLED_RUN = """
import sys
from tokenloom.tokenize import TokenizeConfig, tokenize
if __name__ == "__main__":
    tokenize(TokenizeConfig(input_dir=sys.argv[1], output_dir=sys.argv[2], tokenizer=sys.argv[3], num_workers=1))
"""


@case("tokenize SIGKILLed: its tokenizer hand-off dir is removed by the next run", "faults", "ok")
def _(tmp: Path) -> Run:
    from tokenloom.tokenize import TokenizeConfig, tokenize

    inputs = _corpus(tmp / "in", 20_000)
    temp = tmp / "tmp"
    temp.mkdir()
    script = tmp / "run.py"
    script.write_text(_KILLED_RUN, encoding="utf-8")
    command = [sys.executable, str(script), str(inputs), str(tmp / "out"), str(_tokenizer())]
    child = subprocess.Popen(command, env={**os.environ, "TMPDIR": str(temp)})
    deadline = time.monotonic() + 60
    while not list(temp.glob(f"tokenloom-tokenizer-{child.pid}-*")) and time.monotonic() < deadline:
        if child.poll() is not None:
            break
        time.sleep(0.01)
    child.kill()
    child.wait(timeout=60)
    left = list(temp.glob(f"tokenloom-tokenizer-{child.pid}-*"))

    def rerun() -> None:
        saved = tempfile.tempdir
        tempfile.tempdir = str(temp)
        try:
            tokenize(
                TokenizeConfig(input_dir=inputs, output_dir=tmp / "out", tokenizer=str(_tokenizer()), num_workers=1)
            )
        finally:
            tempfile.tempdir = saved

    def check(_outcome: Outcome) -> str | None:
        if not left:
            return "the killed run left no hand-off dir to test with"
        remaining = list(temp.iterdir())
        return f"left behind: {[p.name for p in remaining]}" if remaining else None

    return Run(call=rerun, check=check)


@case("tokenize: a tokenizer.json with 100,001 added tokens uses hf, saying why", "bad input", "ok")
def _(tmp: Path) -> Run:
    from tokenizers import Tokenizer

    from tokenloom.tokenize import load_encoder
    from tokenloom.tokenize.engine import MAX_FAST_ADDED_TOKENS

    tokenizer = Tokenizer.from_file(str(_tokenizer() / "tokenizer.json"))
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(MAX_FAST_ADDED_TOKENS)])

    def check(outcome: Outcome) -> str | None:
        encoder = outcome.value
        if encoder.name != "hf" or "--engine fast" not in encoder.reason:
            return f"engine {encoder.name}: {encoder.reason}"
        return None

    return Run(call=lambda: load_encoder(tokenizer, "auto"), check=check)
