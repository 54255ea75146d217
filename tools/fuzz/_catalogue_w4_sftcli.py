"""Catalogue rows for issue #37's command line: `tokenize --train-type` over bad records and changed settings.

Each row runs the real command into tmp; bad input must be a named error naming the file and line, with nothing
published (no meta.json, no post_training.json in OUT).
"""

from __future__ import annotations

import json
from pathlib import Path

from _catalogue_base import Outcome, Run, case

Q = {"role": "user", "content": "What does os.sep hold?"}
A = {"role": "assistant", "content": "The path separator."}


def _template() -> str:
    from tokenloom.tokenize.chat import default_chat_template

    return str(default_chat_template())


def _argv(inputs: Path, out: Path, train_type: str, *extra: str, template: bool = True) -> list[str]:
    argv = ["tokenize", "--input-dir", str(inputs), "--output-dir", str(out), "--train-type", train_type]
    argv += ["--num-workers", "0", "--no-progress", *extra]
    return [*argv, "--chat-template", _template()] if template else argv


def _bad_line(tmp: Path, train_type: str, good: dict, bad: bytes) -> Run:
    inputs = tmp / "in"
    inputs.mkdir()
    (inputs / "chat.jsonl").write_bytes((json.dumps(good) + "\n").encode() * 2 + bad + b"\n")
    out = tmp / "out"

    def check(outcome: Outcome) -> str | None:
        text = outcome.stderr + outcome.stdout + str(outcome.exception or "")
        if "chat.jsonl" not in text or "record 3" not in text:
            return "the error names no file and line"
        if (out / "meta.json").exists() or (out / "post_training.json").exists():
            return "a store was published"
        return None

    return Run(argv=_argv(inputs, out, train_type), check=check)


SFT = {"messages": [Q, A]}


@case("tokenize --train-type sft: messages is a string", "bad input", "error", "ConversationError")
def _(tmp: Path) -> Run:
    return _bad_line(tmp, "sft", SFT, b'{"messages": "hello"}')


@case("tokenize --train-type sft: an unknown role", "bad input", "error", "ConversationError")
def _(tmp: Path) -> Run:
    return _bad_line(tmp, "sft", SFT, b'{"messages": [{"role": "robot", "content": "beep"}]}')


@case("tokenize --train-type sft: a line that is not JSON", "bad input", "error", "RecordError")
def _(tmp: Path) -> Run:
    return _bad_line(tmp, "sft", SFT, b'{"messages": [')


@case("tokenize --train-type dpo: no rejected", "bad input", "error", "ConversationError")
def _(tmp: Path) -> Run:
    good = {"prompt": "q", "chosen": "yes", "rejected": "no"}
    return _bad_line(tmp, "dpo", good, b'{"prompt": "q", "chosen": "yes"}')


@case("tokenize --train-type grpo: two rewards for three responses", "bad input", "error", "ConversationError")
def _(tmp: Path) -> Run:
    good = {"prompt": "q", "responses": ["a", "b"], "rewards": [1, 0]}
    return _bad_line(tmp, "grpo", good, b'{"prompt": "q", "responses": ["a", "b", "c"], "rewards": [1, 0]}')


@case("tokenize --train-type grpo: a reward that is NaN", "bad input", "error", "ConversationError")
def _(tmp: Path) -> Run:
    good = {"prompt": "q", "responses": ["a"], "rewards": [1]}
    return _bad_line(tmp, "grpo", good, b'{"prompt": "q", "responses": ["a"], "rewards": ["nan"]}')


@case("tokenize --train-type: a tokenizer without a chat template", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    inputs = tmp / "in"
    inputs.mkdir()
    (inputs / "chat.jsonl").write_text(json.dumps(SFT) + "\n")
    out = tmp / "out"

    def check(_outcome: Outcome) -> str | None:
        return "OUT was written" if out.exists() and any(out.iterdir()) else None

    return Run(argv=_argv(inputs, out, "sft", template=False), check=check)


@case("tokenize --train-type: other settings into a finished output", "bad input", "error", "ResumeMismatchError")
def _(tmp: Path) -> Run:
    from click.testing import CliRunner

    from tokenloom.tokenize._commands import tokenize

    inputs = tmp / "in"
    inputs.mkdir()
    (inputs / "chat.jsonl").write_text(json.dumps(SFT) + "\n")
    out = tmp / "out"
    first = CliRunner().invoke(tokenize, _argv(inputs, out, "sft")[1:])
    if first.exit_code != 0:
        raise RuntimeError(f"the first run failed: {first.output}")
    before = (out / "meta.json").read_bytes()

    def check(_outcome: Outcome) -> str | None:
        return "the store changed" if (out / "meta.json").read_bytes() != before else None

    return Run(argv=_argv(inputs, out, "sft", "--seq-len", "64"), check=check)
