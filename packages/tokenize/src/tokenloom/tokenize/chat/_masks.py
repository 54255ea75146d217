"""Loss masks from the rendering itself: each trained message's character span, mapped to tokens.

For a trained message i (a trained role, at or after the conversation's ``trained_from``):

1. **Where its content starts.** The conversation before it, rendered with the generation prompt
   (``render(messages[:i], add_generation_prompt=True)``), is a prefix of the whole rendering in
   every prefix-preserving template; the content (verbatim, or trimmed as templates often do)
   starts right there. Otherwise the content is searched after the part of the rendering that
   ``messages[:i]`` shares with it.
2. **Where its turn ends.** The template's closing text is what the rendering of ``messages[:i+1]``
   and the whole rendering both have after the content: the text the template emits after this
   turn whatever follows (``<|im_end|>\n``, ``<|eot_id|>``).
3. **The end marker** (trained with the content): the closing text up to and including its last
   special token (what the model emits to stop; a newline after it is not trained). Special tokens the
   turn renders before its end (a tool call's ``<tool_call>``, ``<|python_tag|>``) are trained with
   it; for the conversation's last turn, only the closing that a following turn would share counts
   (not what the template appends to a finished conversation). A closing text without a special token
   (Gemma's ``<end_of_turn>\n`` where the markers are plain text) is trained up to its last character
   that is not whitespace (a token holding that character and more is trained whole); the next turn's
   first token is not. A closing of whitespace only (or none) is trained whole, and when another turn
   follows, so is the first token after it: a template that ends an assistant turn with the next role's
   marker (``<|user|>``) stops generation on that marker, so that is the stop token the model must learn.

4. **Token boundaries.** Characters map to tokens through the encoding's offsets. Where a trained turn's
   start falls inside a token, and one side of the cut is only whitespace, the start moves to the
   token's edge: a token of the content's leading whitespace merged with the header's (``"\n "`` of
   ``assistant\n`` + ``"  hi"`` under byte-level BPE) is masked, so that whitespace is not trained; a
   token holding the template's separating whitespace and the content's first word (Metaspace's
   ``"▁hi"`` after ``[/INST] ``) is trained whole, as the model emits it after the prompt. Any other
   token that covers both trained and masked characters is a MaskError.

Points 1-3 are learnt once per conversation shape where they can be (:mod:`._layout`): a record whose one
rendering is its shape's probe rendering with the contents in place takes them from there.

Every record is then verified (:mod:`._verify`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from functools import partial

import numpy as np

from tokenloom.formats.errors import ChatTemplateError, MaskError, TemplatePrefixError
from tokenloom.tokenize.chat._layout import PROBE as _PROBE
from tokenloom.tokenize.chat._layout import Renders as _Renders
from tokenloom.tokenize.chat._layout import common as _common
from tokenloom.tokenize.chat._layout import layout_of, turn_end
from tokenloom.tokenize.chat._records import Conversation
from tokenloom.tokenize.chat._template import NOWHERE, ChatTokenizer, RecordPlace
from tokenloom.tokenize.chat._verify import MaskedTokens, TrainedSpan, verify_mask

__all__ = ["MaskedTokens", "TrainedSpan", "derive_mask"]


def _locate(full: str, renders: _Renders, turn: int, role: str, place: RecordPlace) -> tuple[int, int] | None:
    """Start and end of message ``turn``'s content in ``full``; None for an empty message the template leaves out."""
    content = renders.conversation.messages[turn]["content"]
    candidates = [content] if content == content.strip() else [content, content.strip()]
    head = renders(turn, generation=role == "assistant")
    if full.startswith(head):
        for candidate in candidates:
            # an empty content right at an empty head proves nothing (a template that cannot render an empty
            # conversation, or injects a default system prompt only into a non-empty one): probe it below
            if (candidate or head) and full.startswith(candidate, len(head)):
                return len(head), len(head) + len(candidate)
    # where the template puts this message's content: its rendering with a probe in place of the content (a
    # template that injects a default system prompt cannot render an empty conversation, so ``head`` is empty)
    message = renders.conversation.messages[turn]
    probe = renders.probe([*renders.conversation.messages[:turn], {**message, "content": _PROBE}])
    at = -1 if probe is None else probe.find(_PROBE)
    if at >= 0 and probe is not None and probe[:at] == full[:at]:
        for candidate in candidates:
            if full.startswith(candidate, at):
                return at, at + len(candidate)
    # after what the conversation so far and the generation prompt share with the rendering (the turn's header,
    # so a content that also appears in the header, "assistant" say, is not found there)
    low = max(_common(renders(turn), full), _common(head, full))
    for candidate in candidates:
        if candidate:
            found = full.find(candidate, low)
            if found >= 0:
                return found, found + len(candidate)
    if not any(candidates):
        return None  # empty, and not where the generation prompt puts a turn: the template left it out
    alone = renders(turn + 1)
    if any(candidate in alone for candidate in candidates):
        raise TemplatePrefixError(
            f"the chat template renders message {turn} ({role}) differently when more turns follow it "
            f"(it drops or rewrites part of it): its content {content[:60]!r} is not in the whole rendering",
            field=f"messages[{turn}]",
            **place.where(),
        )
    raise ChatTemplateError(
        f"message {turn} ({role}) is not in the template's rendering: its content {content[:60]!r} "
        "appears neither verbatim nor trimmed",
        field=f"messages[{turn}]",
        **place.where(),
    )


def _marker_end(
    offsets: np.ndarray,
    special: np.ndarray,
    content_end: int,
    closing_text: str,
    last: bool,
    turn_end: Callable[[], int],
) -> int:
    """Character end of the end marker after ``content_end`` (see the module docstring, point 3).

    ``turn_end()``: for the last turn, the length of its closing that a following turn would share (the
    turn's own text, without what the template appends to a finished conversation).
    """
    starts, ends = offsets[:, 0], offsets[:, 1]
    text, closing = closing_text, len(closing_text)
    after = np.flatnonzero((ends > content_end) & (starts < content_end + closing))
    # special tokens wholly in the closing (a common prefix of characters may end inside a token: "<|" of two)
    marks = [token for token in after.tolist() if special[token] and ends[token] <= content_end + closing]
    if len(marks) > 1 and last:  # which of them end the turn itself
        limit = content_end + turn_end()
        marks = [token for token in marks if ends[token] <= limit] or marks[:1]
    if marks:  # the turn's last special token: tool calls and the like (<tool_call>) come before its end
        return int(ends[marks[-1]])
    text = text[: turn_end()] if last else text
    if text.strip():  # an end marker in plain text (<end_of_turn> not a special token): it, not the whitespace
        end = content_end + len(text.rstrip())  # after it nor the next turn's first token; a token that holds
        inside = np.flatnonzero((starts < end) & (ends > end))  # its last character and more is trained whole
        return int(ends[inside[0]]) if len(inside) else end
    end = content_end + closing
    if not last:
        following = np.flatnonzero(ends > end)
        if len(following):
            return int(ends[following[0]])
    return end


def derive_mask(
    chat: ChatTokenizer,
    conversation: Conversation,
    train_roles: Collection[str] = ("assistant",),
    place: RecordPlace = NOWHERE,
    *,
    after: str | None = None,
) -> MaskedTokens:
    """Render, encode and mask one conversation; verified (MaskError / ChatTemplateError otherwise).

    ``after``: a prefix of the rendering (a grpo prompt with its generation prompt) that is not
    encoded: the tokens are those of the rest, which is what a model generates after that prompt.
    """
    renders = _Renders(chat, conversation, place)
    messages = conversation.messages
    full = renders(len(messages))
    skip = 0
    if after is not None:
        if not full.startswith(after):
            raise TemplatePrefixError(
                "the prompt rendered with the generation prompt is not a prefix of the prompt and a response "
                f"rendered together (they part at character {_common(after, full)})",
                field="prompt",
                **place.where(),
            )
        skip = len(after)
    ids, offsets = chat.encode(full[skip:])
    offsets = offsets + skip
    special = chat.is_special[ids]
    trained_chars = np.zeros(len(full) + 1, dtype=np.int64)
    spans = []
    trained = [t for t, m in enumerate(messages) if t >= conversation.trained_from and m["role"] in train_roles]
    layout = layout_of(chat, conversation)
    known = layout.spans(full, messages) if layout is not None else None
    if known is not None and all(turn in known for turn in trained):
        ends = [layout.turn(turn, turn == len(messages) - 1) for turn in trained]  # type: ignore[union-attr]
        if None not in ends:
            for turn, (closing, tail) in zip(trained, ends, strict=True):  # type: ignore[misc]
                start, content_end = known[turn]
                _check_start(start, skip, turn, messages[turn]["role"], place)
                last = turn == len(messages) - 1
                text = full[content_end : content_end + closing]  # the probe rendering's closing, same characters
                end = _marker_end(offsets, special, content_end, text, last, lambda tail=tail: tail)
                spans.append(TrainedSpan(turn, start, content_end, end))
                trained_chars[start:end] = 1
            trained = []  # every trained turn placed by the layout
    for turn in trained:
        role = messages[turn]["role"]
        located = _locate(full, renders, turn, role, place)
        if located is None:
            continue
        start, content_end = located
        _check_start(start, skip, turn, role, place)
        last = turn == len(messages) - 1
        alone = full if last else renders(turn + 1)
        if alone[:content_end] != full[:content_end]:
            raise TemplatePrefixError(
                f"the chat template renders the conversation up to message {turn} ({role}) differently when "
                "it ends there: the turn's end cannot be found",
                field=f"messages[{turn}]",
                **place.where(),
            )
        closing = full[content_end : content_end + _common(alone[content_end:], full[content_end:])]
        end = _marker_end(offsets, special, content_end, closing, last, partial(turn_end, renders, full, content_end))
        spans.append(TrainedSpan(turn, start, content_end, end))
        trained_chars[start:end] = 1
    spans = _settle_starts(trained_chars, offsets, spans, full)
    mask = _token_mask(trained_chars, offsets, spans, full, ids, place)
    masked = MaskedTokens(full, ids, mask, offsets, spans)
    verify_mask(chat, masked, messages, place, whole=after is None)
    return masked


def _check_start(start: int, skip: int, turn: int, role: str, place: RecordPlace) -> None:
    if start < skip:
        raise TemplatePrefixError(
            f"message {turn} ({role}) is trained but renders inside the prompt", field="prompt", **place.where()
        )


def _settle_starts(
    trained_chars: np.ndarray, offsets: np.ndarray, spans: list[TrainedSpan], full: str
) -> list[TrainedSpan]:
    """Trained spans whose start falls inside a token, moved to a token boundary where that is sound
    (see the module docstring, point 4); ``trained_chars`` is updated with them. Other straddles stay
    (``_token_mask`` names them)."""
    starts, ends = offsets[:, 0], offsets[:, 1]
    settled = []
    for span in spans:
        inside = np.flatnonzero((starts < span.start) & (ends > span.start))
        if len(inside):
            s, e = int(starts[inside[0]]), int(ends[inside[0]])
            if e <= span.content_end and not full[span.start : e].strip():
                trained_chars[span.start : e] = 0  # the content's leading whitespace, merged into the header's token
                span = TrainedSpan(span.turn, e, span.content_end, span.end)
            elif not full[s : span.start].strip() and not trained_chars[s : span.start].any():
                trained_chars[s : span.start] = 1  # the template's separating whitespace, in the content's token
                span = TrainedSpan(span.turn, s, span.content_end, span.end)
        settled.append(span)
    return settled


def _token_mask(
    trained_chars: np.ndarray,
    offsets: np.ndarray,
    spans: list[TrainedSpan],
    full: str,
    ids: np.ndarray,
    place: RecordPlace,
) -> np.ndarray:
    csum = np.concatenate([[0], np.cumsum(trained_chars[: len(full)])])
    starts, ends = offsets[:, 0], offsets[:, 1]
    covered = csum[ends] - csum[starts]
    width = ends - starts
    straddle = (covered > 0) & (covered < width)
    if straddle.any():
        token = int(np.argmax(straddle))
        s, e = int(starts[token]), int(ends[token])
        turn = next((span.turn for span in spans if span.start < e and s < span.end), None)
        raise MaskError(
            f"token {token} (id {int(ids[token])}, {full[s:e]!r}) straddles the boundary of trained message "
            f"{turn}: part of it is trained text, part is not",
            field=f"messages[{turn}]",
            hint="The tokenizer merges the template's text with the message's across the boundary (a message "
            "starting or ending with whitespace, say): trim the messages or end the template's headers with a "
            "special token or newline, or pass --on-error skip to count and skip such records",
            **place.where(),
        )
    zero_width_inside = (width == 0) & (trained_chars[np.minimum(starts, len(full))] > 0) & (starts > 0)
    zero_width_inside &= trained_chars[np.maximum(starts - 1, 0)] > 0
    return ((width > 0) & (covered == width) | zero_width_inside).astype(np.uint8)
