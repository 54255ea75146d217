"""Property tests: random conversations (unicode, empty system prompts, tool turns, long turns) under every
test template. Each record is either verified (tokens are transformers' ``apply_chat_template``, the trained
tokens decode to each assistant content plus its end marker) or a named MaskError for a message whose
leading whitespace the BPE merges with the header; never a wrong mask."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenloom.formats import MaskError
from tokenloom.tokenize.chat import ChatEncoder, runs

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)
WORDS = st.lists(st.sampled_from(["def", " name", "λx", " 数据", "\n", "  ", "😀", "é", " the", "."]), max_size=12)
LONG = st.integers(200, 1500).map(lambda n: ("word " * n).strip())
CONTENT = st.one_of(TEXT, WORDS.map("".join), LONG)


@st.composite
def conversations(draw) -> list[dict[str, str]]:
    messages = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(st.one_of(st.just(""), TEXT))})
    for _ in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": draw(CONTENT)})
        if draw(st.integers(0, 3)) == 0:
            messages.append({"role": "assistant", "content": draw(CONTENT)})
            messages.append({"role": "tool", "content": draw(TEXT)})
        messages.append({"role": "assistant", "content": draw(CONTENT)})
    return messages


@cache
def encoder_for(directory: str) -> ChatEncoder:
    return ChatEncoder(directory)


def expected_pieces(kind: str, messages: list[dict[str, str]]) -> list[str]:
    pieces = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        if kind == "header_bos":
            pieces.append(message["content"].strip() + "<|eot_id|>")
        elif kind == "next_role_marker":
            following = f"<|{messages[i + 1]['role']}|>" if i + 1 < len(messages) else "</s>"
            pieces.append(message["content"] + following)
        else:
            pieces.append(message["content"] + "<|im_end|>")
    return pieces


@pytest.mark.parametrize("kind", ["chatml", "header_bos", "generation_tags", "next_role_marker"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=conversations())
def test_random_conversations(kind: str, messages, chat_tokenizer_dir) -> None:
    encoder = encoder_for(str(chat_tokenizer_dir(kind)))
    hf = encoder.chat.hf
    try:
        sft = encoder.encode({"messages": messages})
    except MaskError as exc:
        assert kind != "header_bos", "a trimming template never straddles"
        assert "straddles" in str(exc)
        assert exc.field is not None
        turn = int(exc.field.split("[")[1].rstrip("]"))
        assert messages[turn]["content"][:1].isspace()
        return
    assert sft is not None
    ids, mask = sft["sequence"], sft["loss_mask"]
    assert ids.tolist() == list(hf.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
    assert 0 < int(mask.sum()) < len(mask)
    found = [encoder.chat.decode(ids[b:e]) for b, e in runs(mask)]
    assert found == expected_pieces(kind, messages)
    if kind == "generation_tags":
        reference = hf.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )["assistant_masks"]
        assert mask.tolist() == list(reference)
    assert np.array_equal(sft["position_ids"], np.arange(len(ids)))


@cache
def typed_encoder(directory: str, train_type: str) -> ChatEncoder:
    return ChatEncoder(directory, train_type=train_type)


@pytest.mark.parametrize("kind", ["chatml", "header_bos"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=conversations(), answers=st.lists(CONTENT, min_size=2, max_size=3))
def test_random_pairs_and_groups(kind: str, prompt, answers, chat_tokenizer_dir) -> None:
    """dpo sides share the prompt's rendering; a grpo prompt's text plus a response's is the whole rendering."""
    directory = str(chat_tokenizer_dir(kind))
    prompt = [*prompt, {"role": "user", "content": "and?"}]
    end = "<|eot_id|>" if kind == "header_bos" else "<|im_end|>"
    expect = [(a.strip() if kind == "header_bos" else a) + end for a in answers]
    dpo = typed_encoder(directory, "dpo")
    try:
        pair = dpo.encode({"prompt": prompt, "chosen": answers[0], "rejected": answers[1]})
    except MaskError as exc:
        assert kind == "chatml" and "straddles" in str(exc)
    else:
        assert pair is not None
        for side, text in (("chosen", expect[0]), ("rejected", expect[1])):
            assert [dpo.chat.decode(pair[side][b:e]) for b, e in runs(pair[f"{side}_mask"])] == [text]
    grpo = typed_encoder(directory, "grpo")
    try:
        group = grpo.encode({"prompt": prompt, "responses": answers, "rewards": list(range(len(answers)))})
    except MaskError as exc:
        assert kind == "chatml" and "straddles" in str(exc)
        return
    assert group is not None
    hf = grpo.chat.hf
    for answer, response, mask, text in zip(answers, group["responses"], group["masks"], expect, strict=True):
        whole = hf.apply_chat_template([*prompt, {"role": "assistant", "content": answer}], tokenize=False)
        assert grpo.chat.decode(group["prompts"]) + grpo.chat.decode(response) == whole
        assert [grpo.chat.decode(response[b:e]) for b, e in runs(mask)] == [text]
