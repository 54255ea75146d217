"""Catalogue rows for issue #37 (post-training data): bad conversations, pairs, groups and templates.

Every row encodes one record as if read from ``in/chat.jsonl`` line 3 and checks that the error names
that file and line; the template rows use templates written here, never a model's.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from _catalogue_base import Outcome, Run, case

WHERE = ("in/chat.jsonl", 3)
Q = {"role": "user", "content": "What does os.sep hold?"}
A = {"role": "assistant", "content": "The path separator."}


@cache
def _encoder(train_type: str = "sft", template: str | None = None) -> Any:
    from tokenloom.tokenize import default_tokenizer_path
    from tokenloom.tokenize.chat import ChatEncoder, default_chat_template

    return ChatEncoder(
        default_tokenizer_path(), chat_template=template or default_chat_template(), train_type=train_type
    )


def _names_record(outcome: Outcome) -> str | None:
    text = str(outcome.exception)
    return None if f"file {WHERE[0]}" in text and f"record {WHERE[1]}" in text else "the error names no file and line"


def _encode(record: Any, train_type: str = "sft", template: str | None = None) -> Run:
    from tokenloom.tokenize.chat import RecordPlace

    return Run(call=lambda: _encoder(train_type, template).encode(record, RecordPlace(*WHERE)), check=_names_record)


def _template(tmp: Path, name: str, text: str) -> str:
    path = tmp / name
    path.write_text(text, encoding="utf-8")
    return str(path)


@case("chat sft: messages is a string", "bad input", "error", "ConversationError")
def _(tmp: Path) -> Run:
    return _encode({"messages": "hello"})


@case("chat sft: a message without content", "bad input", "error", "ConversationError")
def _(tmp: Path) -> Run:
    return _encode({"messages": [Q, {"role": "assistant"}]})


@case("chat sft: a message that is a list, not an object", "bad input", "error", "ConversationError")
def _(tmp: Path) -> Run:
    return _encode({"messages": [["user", "hi"], A]})


@case("chat sft: unknown role 'robot'", "bad input", "error", "ConversationError")
def _(tmp: Path) -> Run:
    return _encode({"messages": [Q, {"role": "robot", "content": "beep"}]})


@case("chat sft: neither messages nor prompt/completion", "bad input", "error", "ConversationError")
def _(tmp: Path) -> Run:
    return _encode({"text": "plain text"})


@case("chat sft: no assistant turn (no trained token)", "bad input", "error", "MaskError")
def _(tmp: Path) -> Run:
    return _encode({"messages": [Q]})


@case("chat dpo: rejected missing", "bad input", "error", "ConversationError")
def _(tmp: Path) -> Run:
    return _encode({"prompt": "q", "chosen": "a"}, "dpo")


@case("chat dpo: chosen missing", "bad input", "error", "ConversationError")
def _(tmp: Path) -> Run:
    return _encode({"prompt": "q", "rejected": "a"}, "dpo")


@case("chat grpo: rewards missing", "bad input", "error", "ConversationError")
def _(tmp: Path) -> Run:
    return _encode({"prompt": "q", "responses": ["a", "b"]}, "grpo")


@case("chat grpo: a NaN reward", "bad input", "error", "ConversationError")
def _(tmp: Path) -> Run:
    return _encode({"prompt": "q", "responses": ["a", "b"], "rewards": [1.0, float("nan")]}, "grpo")


@case("chat grpo: 3 rewards for 2 responses", "bad input", "error", "ConversationError")
def _(tmp: Path) -> Run:
    return _encode({"prompt": "q", "responses": ["a", "b"], "rewards": [1, 0, 1]}, "grpo")


@case("chat grpo: a reward that is a string", "bad input", "error", "ConversationError")
def _(tmp: Path) -> Run:
    return _encode({"prompt": "q", "responses": ["a"], "rewards": ["1.0"]}, "grpo")


@case("chat: a tokenizer without a chat template and none given", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.tokenize import default_tokenizer_path
    from tokenloom.tokenize.chat import ChatEncoder

    return Run(call=lambda: ChatEncoder(default_tokenizer_path()))


@case("chat: a template that raises on a tool turn", "bad input", "error", "ChatTemplateError")
def _(tmp: Path) -> Run:
    template = _template(
        tmp,
        "raises.jinja",
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools') }}{% endif %}"
        "### {{ m.role }}\n{{ m.content }}<|endoftext|>\n{% endfor %}",
    )
    return _encode({"messages": [Q, A, {"role": "tool", "content": "{}"}, A]}, template=template)


@case("chat: a template with a Jinja syntax error", "bad input", "error", "ChatTemplateError")
def _(tmp: Path) -> Run:
    return _encode({"messages": [Q, A]}, template=_template(tmp, "broken.jinja", "{% for m in messages %}{{ m"))


@case("chat: a template that drops earlier reasoning", "bad input", "error", "TemplatePrefixError")
def _(tmp: Path) -> Run:
    template = _template(
        tmp,
        "drops.jinja",
        "{% for m in messages %}{% set c = m.content %}{% if m.role == 'assistant' and not loop.last %}"
        "{% set c = c.split('</think>')[-1] %}{% endif %}### {{ m.role }}\n{{ c }}<|endoftext|>\n{% endfor %}",
    )
    thinking = {"role": "assistant", "content": "<think>hmm</think>yes"}
    return _encode({"messages": [Q, thinking, Q, A]}, template=template)


@case("chat: a template that rewrites the content (upper)", "bad input", "error", "ChatTemplateError")
def _(tmp: Path) -> Run:
    template = _template(
        tmp,
        "upper.jinja",
        "{% for m in messages %}### {{ m.role }}\n{{ m.content | upper }}<|endoftext|>\n{% endfor %}",
    )
    return _encode({"messages": [Q, A]}, template=template)


@case("chat: a token straddles header and content", "bad input", "error", "MaskError")
def _(tmp: Path) -> Run:
    template = _template(
        tmp, "colon.jinja", "{% for m in messages %}{{ m.role }}: {{ m.content }}<|endoftext|>{% endfor %}"
    )
    return _encode({"messages": [Q, A]}, template=template)


@case("chat: a template with no headers (every token trained)", "bad input", "error", "MaskError")
def _(tmp: Path) -> Run:
    template = _template(tmp, "bare.jinja", "{% for m in messages %}{{ m.content }}<|endoftext|>{% endfor %}")
    return _encode({"messages": [A]}, template=template)


@case("chat: --on-error skip counts bad records and writes the rest", "bad input", "ok")
def _(tmp: Path) -> Run:
    from tokenloom.tokenize import default_tokenizer_path
    from tokenloom.tokenize.chat import default_chat_template, write_post_training

    records = [{"messages": [Q, A]}, {"messages": [Q, {"role": "robot", "content": "x"}]}, {"messages": [Q]}]

    def run() -> Any:
        return write_post_training(
            records,
            tmp / "out",
            "sft",
            tokenizer=default_tokenizer_path(),
            chat_template=default_chat_template(),
            on_error="skip",
        )

    def check(outcome: Outcome) -> str | None:
        stats = outcome.value
        return None if (stats.records, stats.skipped_errors) == (1, 2) else f"counts {stats}"

    return Run(call=run, check=check)


@case("record writer: chosen_mask shorter than chosen", "bad input", "error", "ShapeMismatchError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import RecordStoreWriter

    def run() -> None:
        writer = RecordStoreWriter(tmp / "dpo", train_type="dpo", dtype="uint16")
        try:
            writer.add_record({"chosen": [1, 2], "chosen_mask": [1], "rejected": [1], "rejected_mask": [1]})
        finally:
            writer.abort()

    return Run(call=run)


@case("packed sft: conversations longer than seq_len, too_long='error'", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.datasets import PackedSFTDataset
    from tokenloom.formats import RecordStoreWriter

    with RecordStoreWriter(tmp / "sft", train_type="sft", dtype="uint16") as writer:
        writer.add_record({"sequence": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1], "position_ids": [0, 1, 2, 3]})
    return Run(call=lambda: PackedSFTDataset(tmp / "sft", 3, too_long="error"))


@case("inspect --records on a directory that is not a record store", "bad input", "error", "MissingFileError")
def _(tmp: Path) -> Run:
    (tmp / "empty").mkdir()
    return Run(argv=["inspect", str(tmp / "empty"), "--records", "2"])
