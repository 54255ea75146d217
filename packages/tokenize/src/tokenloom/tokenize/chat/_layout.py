"""Where a template puts each message's content, learnt once per conversation shape, so a record renders once.

A conversation's *shape* is everything the template sees but the contents (roles, other keys, tools).
Its *layout* is the rendering of the conversation with a distinct probe in place of each content: the
template's own text between the contents. A record of that shape renders once; where that rendering is the
layout with each probe replaced by its content (verbatim, or trimmed as templates often do) and nothing
else, each content's span is proven, and the rest of the mask derivation (each turn's closing text, the
last turn's end) is the layout's, derived by the prefix renders of :mod:`._masks` once per shape. Where it
is not (a template that rewrites contents, renders depending on them, or a date that changed), the record
takes the prefix renders itself.
"""

from __future__ import annotations

from typing import Any

import orjson

from tokenloom.formats.errors import ChatTemplateError
from tokenloom.tokenize.chat._records import Conversation
from tokenloom.tokenize.chat._template import NOWHERE, ChatTokenizer, RecordPlace

__all__ = ["PROBE", "Layout", "Renders", "common", "layout_of", "turn_end"]

#: stands in for a message's content where the template is probed (text no real message holds)
PROBE = "\u2063tokenloom-probe\u2063"
_SHAPES = 4096  # layouts kept per tokenizer (a run of records of ever-new shapes clears them)


class Renders:
    """Renders of a conversation's prefixes, each done once."""

    def __init__(self, chat: ChatTokenizer, conversation: Conversation, place: RecordPlace) -> None:
        self.chat, self.conversation, self.place = chat, conversation, place
        self._cache: dict[tuple[int, bool], str] = {}

    def __call__(self, count: int, generation: bool = False) -> str:
        key = (count, generation)
        if key not in self._cache:
            messages = self.conversation.messages[:count]
            if count == 0:
                try:
                    text = self.chat.render(messages, tools=self.conversation.tools, add_generation_prompt=generation)
                except ChatTemplateError:
                    text = ""  # many templates cannot render an empty conversation: nothing comes before
            else:
                text = self.chat.render(
                    messages,
                    tools=self.conversation.tools,
                    add_generation_prompt=generation,
                    place=self.place,
                    turn=count,
                )
            self._cache[key] = text
        return self._cache[key]

    def probe(self, messages: list[dict[str, Any]]) -> str | None:
        """The rendering of ``messages`` (a probe the record does not hold), None if the template refuses it."""
        try:
            return self.chat.render(messages, tools=self.conversation.tools)
        except ChatTemplateError:
            return None


def common(a: str, b: str) -> int:
    """Length of the common prefix of two texts (bisection over slice comparisons, which run in C)."""
    low, high = 0, min(len(a), len(b))
    if a[:high] == b[:high]:
        return high
    while high - low > 1:  # a[:low] == b[:low], a[:high] != b[:high]
        middle = (low + high) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle
    return low


def turn_end(renders: Renders, full: str, content_end: int) -> int:
    """Length of the last turn's closing that the rendering with one more (user) turn shares."""
    following = renders.probe([*renders.conversation.messages, {"role": "user", "content": PROBE}])
    return len(full) - content_end if following is None else common(full[content_end:], following[content_end:])


class Layout:
    """The rendering of one shape with probe contents (see the module docstring)."""

    def __init__(self, chat: ChatTokenizer, conversation: Conversation) -> None:
        messages = conversation.messages
        self.probes = [f"\u2063tokenloom-{i}\u2063" for i in range(len(messages))]
        probed = [{**message, "content": p} for message, p in zip(messages, self.probes, strict=True)]
        self.renders = Renders(chat, Conversation(probed, conversation.tools, conversation.trained_from), NOWHERE)
        self.text = text = self.renders(len(messages))
        found = sorted((text.find(p), i) for i, p in enumerate(self.probes) if p in text)
        if any(text.count(self.probes[i]) > 1 for _, i in found):
            raise ValueError("a content renders twice")  # the prefix renders find which one is the turn's
        self.order = [i for _, i in found]
        self.at = {i: at for at, i in found}  # probe start in the layout
        bounds = [0, *(b for at, i in found for b in (at, at + len(self.probes[i]))), len(text)]
        self.pieces = [text[bounds[k] : bounds[k + 1]] for k in range(0, len(bounds), 2)]
        self._turns: dict[int, tuple[int, int] | None] = {}

    def spans(self, full: str, messages: list[dict[str, Any]]) -> dict[int, tuple[int, int]] | None:
        """Each rendered content's ``(start, end)`` in ``full``, None unless ``full`` is the layout with each probe
        replaced by its content, verbatim or trimmed."""
        pieces = self.pieces
        if not full.startswith(pieces[0]):
            return None
        at, spans = len(pieces[0]), {}
        for k, turn in enumerate(self.order):
            content, after = messages[turn]["content"], pieces[k + 1]
            for candidate in (content, content.strip()) if content != content.strip() else (content,):
                end = at + len(candidate)
                if full.startswith(candidate, at) and full.startswith(after, end):
                    break
            else:
                return None
            spans[turn] = (at, end)
            at = end + len(after)
        return spans if at == len(full) else None

    def turn(self, turn: int, last: bool) -> tuple[int, int] | None:
        """Message ``turn``'s closing (the text its rendering alone and the whole rendering share after its
        content) and, for the last turn, the part of it that a following user turn shares; None where the
        conversation up to it renders differently alone (the prefix renders name that)."""
        if turn not in self._turns:
            text, end = self.text, self.at[turn] + len(self.probes[turn])
            alone = text if last else self.renders(turn + 1)
            result = None
            if alone[:end] == text[:end]:
                result = (
                    common(alone[end:], text[end:]),
                    turn_end(self.renders, text, end) if last else len(text) - end,
                )
            self._turns[turn] = result
        return self._turns[turn]


def layout_of(chat: ChatTokenizer, conversation: Conversation) -> Layout | None:
    """The layout of the conversation's shape (made on its first record), None where it cannot be made."""
    try:
        key = orjson.dumps(
            [conversation.tools, [[(k, v) for k, v in m.items() if k != "content"] for m in conversation.messages]]
        )
    except TypeError:
        return None  # a tool or field that is not JSON: the record renders its prefixes
    layouts = chat.layouts
    if key not in layouts:
        if len(layouts) >= _SHAPES:
            layouts.clear()
        try:
            layouts[key] = Layout(chat, conversation)
        except (ChatTemplateError, ValueError):
            layouts[key] = None
    return layouts[key]
