"""Every record's proof: the trained tokens decode to the trained contents plus their end markers, nothing else.

The check decodes token ids (not offsets), so it is independent of the offset mapping that built the
mask: a wrong offset, a token merged across a boundary, a template that rewrote a message, each shows
up as a difference. A mask with no trained token or with every token trained is refused as well.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from tokenloom.formats.errors import MaskError
from tokenloom.tokenize.chat._template import ChatTokenizer, RecordPlace

__all__ = ["MaskedTokens", "TrainedSpan", "runs", "verify_mask"]


class TrainedSpan(NamedTuple):
    """One trained turn in the rendering: ``text[start:content_end]`` is its content, then its end marker."""

    turn: int
    start: int
    content_end: int
    end: int = -1


@dataclass(slots=True)
class MaskedTokens:
    """A rendered, encoded conversation: ids, loss mask (1 = trained) and the trained spans."""

    text: str
    ids: np.ndarray
    mask: np.ndarray
    offsets: np.ndarray
    spans: list[TrainedSpan] = field(default_factory=list)


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """Maximal ``[begin, end)`` runs of ones."""
    padded = np.concatenate([[0], np.asarray(mask, dtype=np.int8), [0]])
    edges = np.flatnonzero(np.diff(padded))
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist(), strict=True))


def _utf8(text: str) -> bytes | None:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: never a decode's text
        return None


def _decoded(chat: ChatTokenizer, ids: np.ndarray, begin: int, end: int, expected: str) -> str:
    """The text of ``ids[begin:end]``; decoded after the tokens before it when alone it differs from
    ``expected`` (a Metaspace decoder drops the first token's leading space of a decode, not of a run inside one)."""
    alone = chat.decode(ids[begin:end])
    if alone == expected or begin == 0:
        return alone
    before, whole = chat.decode(ids[:begin]), chat.decode(ids[:end])
    return whole[len(before) :] if whole.startswith(before) else alone


def verify_mask(
    chat: ChatTokenizer,
    masked: MaskedTokens,
    messages: list[dict[str, Any]],
    place: RecordPlace,
    *,
    whole: bool = True,
) -> None:
    """MaskError unless the mask is proven (see the module docstring); ``whole=False``: a response after
    a masked prompt, which may be trained throughout."""
    mask, ids, text = masked.mask, masked.ids, masked.text
    if not masked.spans or not mask.any():
        raise MaskError(
            "no token is trained: the conversation has no trained-role message after its prompt",
            field="messages",
            hint="Add an assistant turn (or set the trained roles), or pass --on-error skip to count and skip "
            "such records",
            **place.where(),
        )
    if whole and mask.all():
        raise MaskError(
            "every token is trained: the template renders no prompt, header or marker around the trained turns",
            field="messages",
            hint="Use a chat template that marks the roles, or pass --on-error skip to count and skip such records",
            **place.where(),
        )
    expected: list[str] = []
    previous_end = -1
    for span in masked.spans:
        piece = text[span.start : span.end]
        if span.start == previous_end and expected:
            expected[-1] += piece
        else:
            expected.append(piece)
        previous_end = span.end
    trained = runs(mask)
    proven = chat.run_bytes(ids, trained[: len(expected)]) or []  # each run's decode without decoding (_template)
    found = [
        want if k < len(proven) and proven[k] == _utf8(want) else _decoded(chat, ids, *run, want)
        for k, (run, want) in enumerate(zip(trained, expected, strict=False))
    ]
    found += [chat.decode(ids[begin:end]) for begin, end in trained[len(found) :]]
    if found != expected:
        bad = next(
            (i for i, (a, b) in enumerate(zip(found, expected, strict=False)) if a != b), min(len(found), len(expected))
        )
        turn = masked.spans[min(bad, len(masked.spans) - 1)].turn
        got = found[bad] if bad < len(found) else None
        want = expected[bad] if bad < len(expected) else None
        raise MaskError(
            f"the trained tokens do not decode to the trained text: run {bad} decodes to {got!r:.80}, expected "
            f"{want!r:.80} ({len(found)} trained runs, {len(expected)} expected)",
            field=f"messages[{turn}]",
            **place.where(),
        )
    for span in masked.spans:
        content = messages[span.turn]["content"]
        rendered = text[span.start : span.content_end]
        # verbatim, trimmed, or with leading whitespace moved to a token's edge (_masks point 4)
        if rendered not in (content, content.strip()) and rendered.lstrip() not in (content.lstrip(), content.strip()):
            raise MaskError(
                f"message {span.turn}'s rendered content {rendered!r:.60} is not its content {content!r:.60}",
                field=f"messages[{span.turn}]",
                **place.where(),
            )
