"""Post-training records -> conversations: sft messages or prompt/completion, dpo pairs, grpo groups.

A conversation is a list of ``{"role", "content"}`` messages (roles system, user, assistant, tool;
other keys such as ``name`` or ``tool_call_id`` pass through to the template) plus optional ``tools``,
and the index from which trained-role messages are trained: 0 for sft ``messages``, the end of the
prompt for prompt/completion, dpo and grpo (a prompt's own assistant turns are context, not trained).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tokenloom.formats.errors import ConversationError
from tokenloom.tokenize.chat._template import NOWHERE, RecordPlace

__all__ = ["ROLES", "Conversation", "dpo_pair", "grpo_group", "sft_conversation"]

ROLES = ("system", "user", "assistant", "tool")
_FLOAT32_MAX = 3.4028234663852886e38  # rewards are stored as float32: a larger one would be inf


@dataclass(frozen=True, slots=True)
class Conversation:
    messages: list[dict[str, Any]]
    tools: list[Any] | None = None
    #: messages before this index are never trained (a prompt)
    trained_from: int = 0


def _fail(problem: str, place: RecordPlace, field: str) -> ConversationError:
    return ConversationError(problem, field=field, **place.where())


def check_messages(value: Any, place: RecordPlace, field: str) -> list[dict[str, Any]]:
    """``value`` as a list of role/content messages, or ConversationError naming the bad one."""
    if not isinstance(value, list) or not value:
        raise _fail(
            f"{field} is {type(value).__name__}, expected a non-empty list of {{role, content}} objects", place, field
        )
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise _fail(f"{field}[{i}] is {type(message).__name__}, expected a {{role, content}} object", place, field)
        role = message.get("role")
        if role not in ROLES:
            raise _fail(f"{field}[{i}] has role {role!r}, expected one of {list(ROLES)}", place, field)
        content = message.get("content")
        if not isinstance(content, str):
            raise _fail(
                f"{field}[{i}] ({role}) has content of type {type(content).__name__}, expected text", place, field
            )
    return value


def _turns(value: Any, place: RecordPlace, field: str, role: str) -> list[dict[str, Any]]:
    """A text (one ``role`` message) or a list of messages."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    return check_messages(value, place, field)


def _tools(record: dict[str, Any], place: RecordPlace) -> list[Any] | None:
    tools = record.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise _fail(f"tools is {type(tools).__name__}, expected a list of tool schemas", place, "tools")
    return tools or None


def _record(record: Any, place: RecordPlace, *keys: str) -> tuple[dict[str, Any], list[Any] | None]:
    """The record (an object holding ``keys``) and its tools."""
    if not isinstance(record, dict):
        raise _fail(f"the record is {type(record).__name__}, expected a JSON object", place, "record")
    for key in keys:
        if key not in record:
            raise _fail(f"the record has no {key!r} (keys {sorted(record)[:8]})", place, key)
    return record, _tools(record, place)


def sft_conversation(record: Any, place: RecordPlace = NOWHERE) -> Conversation:
    """``{"messages": [...]}`` (every trained-role turn trained) or ``{"prompt", "completion"}``."""
    record, tools = _record(record, place)
    if "messages" in record:
        return Conversation(check_messages(record["messages"], place, "messages"), tools, 0)
    if "prompt" in record and "completion" in record:
        prompt = _turns(record["prompt"], place, "prompt", "user")
        completion = _turns(record["completion"], place, "completion", "assistant")
        return Conversation(prompt + completion, tools, len(prompt))
    raise _fail(
        f"the record has keys {sorted(record)[:8]}, expected 'messages' or 'prompt' and 'completion'", place, "messages"
    )


def _continuation(prompt: list[dict[str, Any]], value: Any, place: RecordPlace, field: str) -> list[dict[str, Any]]:
    """The messages after the prompt: a text, a continuation list, or a whole conversation starting with it."""
    turns = _turns(value, place, field, "assistant")
    if len(turns) > len(prompt) and turns[: len(prompt)] == prompt:
        turns = turns[len(prompt) :]
    return turns


def _shared_prefix(chosen: list[dict[str, Any]], rejected: list[dict[str, Any]]) -> int:
    n = 0
    while n < min(len(chosen), len(rejected)) - 1 and chosen[n] == rejected[n]:
        n += 1
    return n


def dpo_pair(record: Any, place: RecordPlace = NOWHERE) -> tuple[Conversation, Conversation]:
    """``{"prompt", "chosen", "rejected"}``: chosen/rejected as the continuation, or as whole conversations.

    Without ``prompt``, chosen and rejected must be whole conversations; their shared leading
    messages are the prompt.
    """
    record, tools = _record(record, place, "chosen", "rejected")
    if "prompt" in record:
        prompt = _turns(record["prompt"], place, "prompt", "user")
        sides = [_continuation(prompt, record[side], place, side) for side in ("chosen", "rejected")]
    else:
        whole = [check_messages(record[side], place, side) for side in ("chosen", "rejected")]
        shared = _shared_prefix(*whole)
        if shared == 0:
            raise _fail("chosen and rejected share no leading message and there is no 'prompt'", place, "prompt")
        prompt, sides = whole[0][:shared], [w[shared:] for w in whole]
    return tuple(Conversation(prompt + side, tools, len(prompt)) for side in sides)  # type: ignore[return-value]


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value) and abs(value) <= _FLOAT32_MAX
    except OverflowError:  # an integer beyond float range (json.loads reads 1e400 written as digits)
        return False


def grpo_group(
    record: Any, place: RecordPlace = NOWHERE
) -> tuple[list[dict[str, Any]], list[Any] | None, list[list[dict[str, Any]]], list[float]]:
    """``{"prompt", "responses": [...], "rewards": [...]}``: the prompt, each response's turns, the rewards."""
    record, tools = _record(record, place, "prompt", "responses", "rewards")
    prompt = _turns(record["prompt"], place, "prompt", "user")
    responses, rewards = record["responses"], record["rewards"]
    if not isinstance(responses, list) or not responses:
        raise _fail(f"responses is {type(responses).__name__}, expected a non-empty list", place, "responses")
    if not isinstance(rewards, list):
        raise _fail(f"rewards is {type(rewards).__name__}, expected a list of numbers", place, "rewards")
    if len(rewards) != len(responses):
        raise _fail(
            f"{len(rewards)} rewards for {len(responses)} responses, expected one per response", place, "rewards"
        )
    for i, reward in enumerate(rewards):
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not _finite(reward):
            raise _fail(
                f"rewards[{i}] is {reward!r:.40}, expected a finite number (stored as float32: |r| <= 3.4e38)",
                place,
                "rewards",
            )
    turns = [_turns(r, place, f"responses[{i}]", "assistant") for i, r in enumerate(responses)]
    return prompt, tools, turns, [float(r) for r in rewards]
