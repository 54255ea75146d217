"""One render per record (tokenloom.tokenize.chat._layout) gives the masks the prefix renders give; the trained
runs proven from token bytes (ChatTokenizer.decodes_to) are exactly what tokenizers decodes."""

from __future__ import annotations

import random
from functools import cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenloom.formats import ChatTemplateError, RecordError
from tokenloom.tokenize.chat import ChatEncoder, derive_mask
from tokenloom.tokenize.chat import _masks as masks
from tokenloom.tokenize.chat._records import Conversation

KINDS = ["chatml", "header_bos", "generation_tags", "next_role_marker", "drops_reasoning", "end_marker", "turn_markers"]
TEXT = st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20),
    st.lists(st.sampled_from(["user", "assistant", " x", "\n", "  ", "<|im_end|>", "数据", "."]), max_size=8).map(
        "".join
    ),
)


@st.composite
def conversations(draw) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": draw(TEXT)}] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": draw(TEXT)})
        if draw(st.integers(0, 3)) == 0:
            messages.append({"role": "tool", "content": draw(TEXT)})
        messages.append({"role": "assistant", "content": draw(TEXT), **draw(st.sampled_from([{}, {"reasoning": "r"}]))})
    return messages


@cache
def encoder_for(directory: str) -> ChatEncoder:
    return ChatEncoder(directory)


def both(chat, conversation: Conversation, monkeypatch: pytest.MonkeyPatch, after: str | None = None):
    """derive_mask with the layout, then with the prefix renders alone: each result or the error's type."""
    results = []
    for layout in (masks.layout_of, lambda chat, conversation: None):  # pyright: ignore[reportPrivateImportUsage]
        monkeypatch.setattr(masks, "layout_of", layout)
        try:
            masked = derive_mask(chat, conversation, after=after)
            results.append((masked.text, masked.ids.tolist(), masked.mask.tolist(), masked.spans))
        except RecordError as exc:
            results.append(type(exc).__name__)
    monkeypatch.undo()
    return results


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=conversations())
def test_one_render_gives_the_prefix_renders_masks(kind: str, messages, chat_tokenizer_dir) -> None:
    chat = encoder_for(str(chat_tokenizer_dir(kind))).chat
    with pytest.MonkeyPatch.context() as monkeypatch:
        with_layout, prefix_renders = both(chat, Conversation(messages), monkeypatch)
    assert with_layout == prefix_renders


@pytest.mark.parametrize("kind", ["chatml", "header_bos", "next_role_marker", "end_marker"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=conversations())
def test_one_render_after_a_prompt_gives_the_prefix_renders_masks(kind: str, messages, chat_tokenizer_dir) -> None:
    """grpo: a response after its prompt rendered with the generation prompt."""
    chat = encoder_for(str(chat_tokenizer_dir(kind))).chat
    prompt = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    try:
        after = chat.render(messages[:prompt], add_generation_prompt=True)
    except RecordError:
        return
    with pytest.MonkeyPatch.context() as monkeypatch:
        with_layout, prefix_renders = both(chat, Conversation(messages, None, prompt), monkeypatch, after)
    assert with_layout == prefix_renders


def test_a_shape_is_probed_once_and_rewriting_templates_fall_back(chat_tokenizer_dir, tmp_path) -> None:
    chat = ChatEncoder(chat_tokenizer_dir("chatml")).chat
    first = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    second = [{"role": "user", "content": "why"}, {"role": "assistant", "content": "because"}]
    derive_mask(chat, Conversation(first))
    derive_mask(chat, Conversation(second))
    assert len(chat.layouts) == 1
    layout = next(iter(chat.layouts.values()))
    assert layout.spans(chat.render(second), second) is not None
    # a template that trims contents: the layout places the trimmed contents
    trimmed = [{"role": "user", "content": " hi "}, {"role": "assistant", "content": "  hello\n"}]
    template = tmp_path / "trim.jinja"
    template.write_text(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n{% endfor %}"
    )
    chat = ChatEncoder(chat_tokenizer_dir("chatml"), chat_template=template).chat
    masked = derive_mask(chat, Conversation(trimmed))
    assert [masked.text[s.start : s.content_end] for s in masked.spans] == ["hello"]
    # a template that rewrites contents: no layout places them (the prefix renders do, or name the error)
    template.write_text(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | replace('a', 'b') }}<|im_end|>\n"
        "{% endfor %}"
    )
    chat = ChatEncoder(chat_tokenizer_dir("chatml"), chat_template=template).chat
    rewritten = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "cab"}]
    with pytest.raises(RecordError):
        derive_mask(chat, Conversation(rewritten))


@pytest.mark.parametrize("kind", ["chatml", "header_bos"])
def test_run_bytes_read_as_utf8_are_tokenizers_decode(kind: str, chat_tokenizer_dir) -> None:
    chat = ChatEncoder(chat_tokenizer_dir(kind)).chat
    assert chat.engine == "fast"
    rng = random.Random(0)
    assert chat._backend is not None
    size = chat._backend.get_vocab_size(with_added_tokens=True)
    ids = np.asarray([rng.randrange(size) for _ in range(30000)])
    runs = []
    while len(runs) < 3000:
        begin = rng.randrange(len(ids) - 12)
        runs.append((begin, begin + rng.randint(0, 12)))
    proven = chat.run_bytes(ids, runs)
    assert proven is not None
    valid = 0
    for (begin, end), data in zip(runs, proven, strict=True):
        text = chat.decode(ids[begin:end])
        assert data.decode("utf-8", "replace") == text
        valid += "\ufffd" not in text
    assert valid > 1000


TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=conversations(), tools=st.sampled_from([None, TOOLS]), generation=st.booleans())
def test_direct_render_is_apply_chat_template(kind: str, messages, tools, generation, chat_tokenizer_dir) -> None:
    chat = encoder_for(str(chat_tokenizer_dir(kind))).chat
    assert chat._direct is not None
    try:
        expected = chat.hf.apply_chat_template(
            messages, tools=tools, chat_template=chat.template, tokenize=False, add_generation_prompt=generation
        )
    except Exception as exc:  # the template refuses the conversation (roles that do not alternate): so does render
        with pytest.raises(ChatTemplateError, match=type(exc).__name__):
            chat.render(messages, tools=tools, add_generation_prompt=generation)
        return
    assert chat.render(messages, tools=tools, add_generation_prompt=generation) == expected
