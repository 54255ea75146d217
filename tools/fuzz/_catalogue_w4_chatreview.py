"""Catalogue rows from the review of issue #37: dpo sides with two prompts, grpo rewards beyond float32.

Shapes as in ``_catalogue_w4_chat`` (each record as if read from ``in/chat.jsonl`` line 3).
"""

from __future__ import annotations

from pathlib import Path

from _catalogue_base import Run, case
from _catalogue_w4_chat import _encode

Q = {"role": "user", "content": "What does os.sep hold?"}
A = {"role": "assistant", "content": "The path separator."}


@case("chat dpo: whole conversations that part before the answer", "bad input", "error", "ConversationError")
def _(tmp: Path) -> Run:
    other = {"role": "user", "content": "What does os.linesep hold?"}
    return _encode({"chosen": [Q, A], "rejected": [other, A]}, "dpo")


@case("chat dpo: a chosen side bringing its own question", "bad input", "error", "ConversationError")
def _(tmp: Path) -> Run:
    return _encode({"prompt": [Q], "chosen": [{"role": "user", "content": "Really?"}, A], "rejected": "no"}, "dpo")


@case("chat grpo: a reward beyond float32 (inf once stored)", "bad input", "error", "ConversationError")
def _(tmp: Path) -> Run:
    return _encode({"prompt": "q", "responses": ["a"], "rewards": [1e39]}, "grpo")


@case("chat grpo: an integer reward beyond float range", "bad input", "error", "ConversationError")
def _(tmp: Path) -> Run:
    return _encode({"prompt": "q", "responses": ["a"], "rewards": [10**400]}, "grpo")
