"""Loss masks derived from the chat template's rendering, proven per record (tokenloom.tokenize.chat).

Tokenizer directories are the shipped BPE plus each test template's special tokens (conftest
``chat_tokenizer_dir``); the templates in tests/chat_templates/ are the project's own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenize_helpers import turns
from transformers import AutoTokenizer

from tokenloom.formats import ChatTemplateError, ConfigError, ConversationError, MaskError, TemplatePrefixError
from tokenloom.tokenize.chat import (
    ChatEncoder,
    ChatTokenizer,
    Conversation,
    RecordPlace,
    default_chat_template,
    derive_mask,
    runs,
)

KINDS = ["chatml", "header_bos", "generation_tags", "next_role_marker", "drops_reasoning"]

CONVERSATION = turns(
    "system: You answer questions about the standard library.",
    "user: What does os.path.join do?",
    "assistant: It joins path components.",
    "user: And json.dumps? 😀",
    "assistant: Serialize an object to a JSON formatted str. ünïcode",
)


def trained_texts(chat: ChatTokenizer, ids: np.ndarray, mask: np.ndarray) -> list[str]:
    return [chat.decode(ids[b:e]) for b, e in runs(mask)]


def _chatml_with(chat_tokenizer_dir, template: str) -> ChatEncoder:
    """An encoder of the chatml test tokenizer with the chat template text ``template``."""
    return ChatEncoder(chat_tokenizer_dir("chatml"), chat_template=template)


@pytest.mark.parametrize("kind", KINDS)
def test_tokens_are_apply_chat_template(kind: str, chat_tokenizer_dir) -> None:
    directory = chat_tokenizer_dir(kind)
    hf = AutoTokenizer.from_pretrained(directory)
    sft = ChatEncoder(directory).encode({"messages": CONVERSATION})
    assert sft is not None
    expected = hf.apply_chat_template(CONVERSATION, tokenize=True, return_dict=True)["input_ids"]
    assert sft["sequence"].tolist() == list(expected)
    assert sft["position_ids"].tolist() == list(range(len(expected)))
    assert 0 < sft["loss_mask"].sum() < len(expected)


def test_chatml_trains_contents_and_im_end(chat_tokenizer_dir) -> None:
    encoder = ChatEncoder(chat_tokenizer_dir("chatml"))
    sft = encoder.encode({"messages": CONVERSATION})
    assert sft is not None
    assert trained_texts(encoder.chat, sft["sequence"], sft["loss_mask"]) == [
        "It joins path components.<|im_end|>",
        "Serialize an object to a JSON formatted str. ünïcode<|im_end|>",
    ]


def test_header_template_masks_bos_and_headers(chat_tokenizer_dir) -> None:
    encoder = ChatEncoder(chat_tokenizer_dir("header_bos"))
    messages = [*CONVERSATION[:2], {"role": "assistant", "content": "  padded answer \n"}]
    sft = encoder.encode({"messages": messages})
    assert sft is not None
    ids, mask = sft["sequence"], sft["loss_mask"]
    assert encoder.chat.decode(ids[:1]) == "<|begin_of_text|>" and mask[0] == 0
    assert trained_texts(encoder.chat, ids, mask) == ["padded answer<|eot_id|>"]  # the template trims


def assistant_conversations() -> list[list[dict[str, str]]]:
    return [
        CONVERSATION,
        CONVERSATION[1:3],
        [{"role": "system", "content": ""}, *CONVERSATION[1:3]],
        [
            {"role": "user", "content": "list files"},
            {"role": "assistant", "content": "calling ls"},
            {"role": "tool", "content": '{"files": ["a", "b"]}'},
            {"role": "assistant", "content": "a and b"},
        ],
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}],
    ]


@pytest.mark.parametrize("index", range(5))
def test_generation_tags_mask_equals_transformers(index: int, chat_tokenizer_dir) -> None:
    directory = chat_tokenizer_dir("generation_tags")
    messages = assistant_conversations()[index]
    hf = AutoTokenizer.from_pretrained(directory)
    reference = hf.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    sft = ChatEncoder(directory).encode({"messages": messages})
    assert sft is not None
    assert sft["sequence"].tolist() == list(reference["input_ids"])
    assert sft["loss_mask"].tolist() == list(reference["assistant_masks"])


def test_next_role_marker_template_trains_the_stop_token(chat_tokenizer_dir) -> None:
    """The turn ends with the next role's marker: that marker is the end marker, so the model learns to stop."""
    encoder = ChatEncoder(chat_tokenizer_dir("next_role_marker"))
    sft = encoder.encode({"messages": CONVERSATION})
    assert sft is not None
    texts = trained_texts(encoder.chat, sft["sequence"], sft["loss_mask"])
    assert texts == [
        "It joins path components.<|user|>",
        "Serialize an object to a JSON formatted str. ünïcode</s>",
    ]


def test_dropped_reasoning_is_a_named_error_where_it_matters(chat_tokenizer_dir) -> None:
    encoder = ChatEncoder(chat_tokenizer_dir("drops_reasoning"))
    thinking = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "<think>hmm</think>a1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "<think>so</think>a2"},
    ]
    with pytest.raises(TemplatePrefixError) as caught:
        encoder.encode({"messages": thinking}, RecordPlace("chats.jsonl", 7))
    assert caught.value.path == "chats.jsonl" and caught.value.record == 7 and caught.value.field == "messages[1]"
    # the last turn keeps its reasoning: training only it is fine
    last = ChatEncoder(chat_tokenizer_dir("drops_reasoning"), train_type="sft").encode(
        {"prompt": thinking[:3], "completion": thinking[3:]}
    )
    assert last is not None
    assert trained_texts(encoder.chat, last["sequence"], last["loss_mask"]) == ["<think>so</think>a2<|im_end|>"]
    # without reasoning in earlier turns, the template renders every turn as given
    plain = encoder.encode({"messages": CONVERSATION})
    assert plain is not None


def test_prompt_completion_trains_only_the_completion(chat_tokenizer_dir) -> None:
    encoder = ChatEncoder(chat_tokenizer_dir("chatml"))
    sft = encoder.encode({"prompt": CONVERSATION[:3] + CONVERSATION[3:4], "completion": "done"})
    assert sft is not None
    assert trained_texts(encoder.chat, sft["sequence"], sft["loss_mask"]) == ["done<|im_end|>"]
    text = encoder.encode({"prompt": "hi", "completion": "hello"})
    assert text is not None
    assert trained_texts(encoder.chat, text["sequence"], text["loss_mask"]) == ["hello<|im_end|>"]


def test_train_roles(chat_tokenizer_dir) -> None:
    encoder = ChatEncoder(chat_tokenizer_dir("chatml"), train_roles=("assistant", "tool"))
    messages = assistant_conversations()[3]
    sft = encoder.encode({"messages": messages})
    assert sft is not None
    assert trained_texts(encoder.chat, sft["sequence"], sft["loss_mask"]) == [
        "calling ls<|im_end|>",
        '{"files": ["a", "b"]}<|im_end|>',
        "a and b<|im_end|>",
    ]


def test_dpo_sides_share_the_prompt(chat_tokenizer_dir) -> None:
    encoder = ChatEncoder(chat_tokenizer_dir("chatml"), train_type="dpo")
    pair = encoder.encode({"prompt": CONVERSATION[:4], "chosen": "good answer", "rejected": "bad"})
    assert pair is not None
    chat = encoder.chat
    assert trained_texts(chat, pair["chosen"], pair["chosen_mask"]) == ["good answer<|im_end|>"]
    assert trained_texts(chat, pair["rejected"], pair["rejected_mask"]) == ["bad<|im_end|>"]
    first = int(np.argmax(pair["chosen_mask"]))
    assert first == int(np.argmax(pair["rejected_mask"]))
    assert pair["chosen"][:first].tolist() == pair["rejected"][:first].tolist()
    whole = encoder.encode(
        {
            "chosen": [*CONVERSATION[:4], {"role": "assistant", "content": "good answer"}],
            "rejected": [*CONVERSATION[:4], {"role": "assistant", "content": "bad"}],
        }
    )
    assert whole is not None
    assert all(np.array_equal(whole[k], pair[k]) for k in pair)
    listed = encoder.encode(
        {"prompt": CONVERSATION[:4], "chosen": [{"role": "assistant", "content": "good answer"}], "rejected": "bad"}
    )
    assert listed is not None
    assert all(np.array_equal(listed[k], pair[k]) for k in pair)


def test_grpo_groups(chat_tokenizer_dir) -> None:
    encoder = ChatEncoder(chat_tokenizer_dir("header_bos"), train_type="grpo")
    group = encoder.encode(
        {"prompt": CONVERSATION[:2], "responses": ["one", "two words", "3"], "rewards": [1, 0, -0.5]}
    )
    assert group is not None
    chat = encoder.chat
    hf = AutoTokenizer.from_pretrained(chat_tokenizer_dir("header_bos"))
    prompt = hf.apply_chat_template(CONVERSATION[:2], tokenize=True, add_generation_prompt=True, return_dict=True)
    assert group["prompts"].tolist() == list(prompt["input_ids"])
    assert group["rewards"].tolist() == [1.0, 0.0, -0.5]
    for response, mask, text in zip(group["responses"], group["masks"], ["one", "two words", "3"], strict=True):
        assert trained_texts(chat, response, mask) == [f"{text}<|eot_id|>"]
        # the response's tokens are what follows the prompt's: the whole rendering, less the prompt's text
        whole = hf.apply_chat_template([*CONVERSATION[:2], {"role": "assistant", "content": text}], tokenize=False)
        assert chat.decode(group["prompts"]) + chat.decode(response) == whole


@pytest.mark.parametrize(
    ("record", "field"),
    [
        ({"messages": "hi"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user"}]}, "messages"),
        ({"messages": [["user", "hi"]]}, "messages"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages"),
        ({"text": "no messages"}, "messages"),
        ([1, 2], "record"),
    ],
)
def test_bad_sft_records(record, field, chat_tokenizer_dir) -> None:
    encoder = ChatEncoder(chat_tokenizer_dir("chatml"))
    with pytest.raises(ConversationError) as caught:
        encoder.encode(record, RecordPlace("in/a.jsonl", 3))
    assert (caught.value.path, caught.value.record, caught.value.field) == ("in/a.jsonl", 3, field)


@pytest.mark.parametrize(
    ("train_type", "record", "field"),
    [
        ("dpo", {"prompt": "q", "chosen": "a"}, "rejected"),
        ("dpo", {"prompt": "q", "rejected": "a"}, "chosen"),
        (
            "dpo",
            {"chosen": [{"role": "user", "content": "a"}], "rejected": [{"role": "user", "content": "b"}]},
            "prompt",
        ),
        ("grpo", {"prompt": "q", "responses": ["a"]}, "rewards"),
        ("grpo", {"prompt": "q", "rewards": [1]}, "responses"),
        ("grpo", {"prompt": "q", "responses": ["a", "b"], "rewards": [1]}, "rewards"),
        ("grpo", {"prompt": "q", "responses": ["a"], "rewards": [float("nan")]}, "rewards"),
        ("grpo", {"prompt": "q", "responses": ["a"], "rewards": [float("inf")]}, "rewards"),
        ("grpo", {"prompt": "q", "responses": ["a"], "rewards": ["1"]}, "rewards"),
        ("grpo", {"prompt": "q", "responses": ["a"], "rewards": [True]}, "rewards"),
        ("grpo", {"prompt": "q", "responses": [], "rewards": []}, "responses"),
    ],
)
def test_bad_pairs_and_groups(train_type, record, field, chat_tokenizer_dir) -> None:
    encoder = ChatEncoder(chat_tokenizer_dir("chatml"), train_type=train_type)
    with pytest.raises(ConversationError) as caught:
        encoder.encode(record, RecordPlace("in/p.jsonl", 9))
    assert (caught.value.path, caught.value.record, caught.value.field) == ("in/p.jsonl", 9, field)


def test_no_chat_template_is_a_config_error(tmp_path: Path, chat_tokenizer_dir) -> None:
    from tokenloom.tokenize import default_tokenizer_path

    with pytest.raises(ConfigError, match="no chat template"):
        ChatEncoder(default_tokenizer_path())
    encoder = ChatEncoder(default_tokenizer_path(), chat_template=default_chat_template())
    assert encoder.encode({"messages": CONVERSATION}) is not None


def test_jinja_error_carries_the_record(tmp_path: Path, chat_tokenizer_dir) -> None:
    encoder = _chatml_with(
        chat_tokenizer_dir,
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",
    )
    with pytest.raises(ChatTemplateError, match="no tools here") as caught:
        encoder.encode({"messages": assistant_conversations()[3]}, RecordPlace("in/t.jsonl", 12))
    assert caught.value.path == "in/t.jsonl" and caught.value.record == 12
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m.content }")
    with pytest.raises(ChatTemplateError, match="TemplateSyntaxError"):
        ChatEncoder(chat_tokenizer_dir("chatml"), chat_template=broken).encode({"messages": CONVERSATION})


def test_straddling_token_is_a_mask_error(tmp_path: Path, chat_tokenizer_dir) -> None:
    # "assistant:de" then the content: the BPE merges "de" + "fine"
    encoder = _chatml_with(
        chat_tokenizer_dir,
        "{% for m in messages %}{{ m.role }}:de{{ m.content }}<|im_end|>{% endfor %}",
    )
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "fine thanks"}]
    with pytest.raises(MaskError, match="straddles") as caught:
        encoder.encode({"messages": messages}, RecordPlace("in/s.jsonl", 2))
    assert caught.value.record == 2 and caught.value.field == "messages[1]"


def test_whitespace_at_a_trained_start_moves_to_a_token_edge(tmp_path: Path, chat_tokenizer_dir) -> None:
    """The template's separating space in the content's first token: that token is trained whole (the model
    emits " It" after "assistant:"); the content's leading whitespace in the header's token: that token is masked."""
    # "assistant: " then the content: the BPE merges " It"
    encoder = _chatml_with(
        chat_tokenizer_dir,
        "{% for m in messages %}{{ m.role }}: {{ m.content }}<|im_end|>{% endfor %}",
    )
    sft = encoder.encode({"messages": CONVERSATION[1:3]})
    assert sft is not None
    found = [encoder.chat.decode(sft["sequence"][b:e]) for b, e in runs(sft["loss_mask"])]
    assert found == [" It joins path components.<|im_end|>"]
    chatml = ChatEncoder(chat_tokenizer_dir("chatml"))
    for content in ("  two spaces", "\n\n  newlines", " \t tab", "   "):
        sft = chatml.encode({"messages": [CONVERSATION[1], {"role": "assistant", "content": content}]})
        assert sft is not None
        ids, mask = sft["sequence"], sft["loss_mask"]
        [(begin, end)] = runs(mask)
        trained = chatml.chat.decode(ids[begin:end])
        assert trained.endswith("<|im_end|>") and content.endswith(trained.removesuffix("<|im_end|>"))
        assert not chatml.chat.decode(ids[begin - 1 : begin]).strip()  # what is left out is whitespace


def test_no_trained_token_and_all_trained_are_errors(tmp_path: Path, chat_tokenizer_dir) -> None:
    encoder = ChatEncoder(chat_tokenizer_dir("chatml"))
    with pytest.raises(MaskError, match="no token is trained"):
        encoder.encode({"messages": CONVERSATION[:2]})
    bare = tmp_path / "bare.jinja"
    bare.write_text("{% for m in messages %}{{ m.content }}<|im_end|>{% endfor %}")
    with pytest.raises(MaskError, match="every token is trained"):
        ChatEncoder(chat_tokenizer_dir("chatml"), chat_template=bare).encode(
            {"messages": [{"role": "assistant", "content": "alone"}]}
        )


def test_rewritten_content_is_a_named_error(tmp_path: Path, chat_tokenizer_dir) -> None:
    upper = tmp_path / "upper.jinja"
    upper.write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | upper }}<|im_end|>\n{% endfor %}")
    with pytest.raises(ChatTemplateError, match="not in the template's rendering"):
        ChatEncoder(chat_tokenizer_dir("chatml"), chat_template=upper).encode({"messages": CONVERSATION})


def test_on_error_skip_counts(chat_tokenizer_dir) -> None:
    encoder = ChatEncoder(chat_tokenizer_dir("chatml"), on_error="skip")
    assert encoder.encode({"messages": [{"role": "robot", "content": "x"}]}) is None
    assert encoder.encode({"messages": CONVERSATION[:2]}) is None
    assert encoder.encode({"messages": CONVERSATION}) is not None
    assert encoder.stats.skipped_errors == 2 and encoder.stats.records == 1
    assert encoder.stats.errors == {"ConversationError": 1, "MaskError": 1}


def test_max_length_policies(chat_tokenizer_dir) -> None:
    directory = chat_tokenizer_dir("chatml")
    full = ChatEncoder(directory).encode({"messages": CONVERSATION})
    assert full is not None
    n = len(full["sequence"])
    skip = ChatEncoder(directory, seq_len=n - 1)
    assert skip.encode({"messages": CONVERSATION}) is None and skip.stats.skipped_too_long == 1
    assert skip.stats.records == 0
    start = ChatEncoder(directory, seq_len=n - 5, truncate="keep-start")
    cut = start.encode({"messages": CONVERSATION})
    assert cut is not None
    assert cut["sequence"].tolist() == full["sequence"][: n - 5].tolist()
    assert cut["loss_mask"].tolist() == full["loss_mask"][: n - 5].tolist() and start.stats.truncated == 1
    end = ChatEncoder(directory, seq_len=n - 5, truncate="keep-end")
    cut = end.encode({"messages": CONVERSATION})
    assert cut is not None
    assert cut["sequence"].tolist() == full["sequence"][5:].tolist()
    assert ChatEncoder(directory, seq_len=n).encode({"messages": CONVERSATION}) is not None
    with pytest.raises(ConfigError):
        ChatEncoder(directory, truncate="middle")
    with pytest.raises(ConfigError):
        ChatEncoder(directory, train_roles=("robot",))


def test_derive_mask_spans_point_into_the_rendering(chat_tokenizer_dir) -> None:
    chat = ChatTokenizer(chat_tokenizer_dir("chatml"))
    masked = derive_mask(chat, Conversation(CONVERSATION))
    for span in masked.spans:
        assert masked.text[span.start : span.content_end] == CONVERSATION[span.turn]["content"]
        assert masked.text[span.content_end : span.end] == "<|im_end|>"


def test_tools_are_rendered_and_masked(chat_tokenizer_dir) -> None:
    directory = chat_tokenizer_dir("chatml")
    tools = [{"type": "function", "function": {"name": "ls", "description": "list files", "parameters": {}}}]
    messages = assistant_conversations()[3]
    encoder = ChatEncoder(directory)
    sft = encoder.encode({"messages": messages, "tools": tools})
    assert sft is not None
    hf = AutoTokenizer.from_pretrained(directory)
    expected = hf.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True)["input_ids"]
    assert sft["sequence"].tolist() == list(expected)
    assert "# Tools" in encoder.chat.decode(sft["sequence"][sft["loss_mask"] == 0])
    assert trained_texts(encoder.chat, sft["sequence"], sft["loss_mask"]) == [
        "calling ls<|im_end|>",
        "a and b<|im_end|>",
    ]
    with pytest.raises(ConversationError):
        encoder.encode({"messages": messages, "tools": "ls"})


FORCED_THINKING = (  # the generation prompt opens a <think> block the conversation's own turns do not have
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)


def test_generation_prompt_unlike_the_turns(tmp_path: Path, chat_tokenizer_dir) -> None:
    """sft finds the turns without the generation prompt; grpo, whose prompt it is, gets a named error."""
    template = tmp_path / "forced.jinja"
    template.write_text(FORCED_THINKING)
    encoder = ChatEncoder(chat_tokenizer_dir("chatml"), chat_template=template)
    sft = encoder.encode({"messages": CONVERSATION})
    assert sft is not None
    assert trained_texts(encoder.chat, sft["sequence"], sft["loss_mask"]) == [
        "It joins path components.<|im_end|>",
        "Serialize an object to a JSON formatted str. ünïcode<|im_end|>",
    ]
    grpo = ChatEncoder(chat_tokenizer_dir("chatml"), chat_template=template, train_type="grpo")
    with pytest.raises(TemplatePrefixError) as caught:
        grpo.encode({"prompt": "q", "responses": ["a"], "rewards": [1]}, RecordPlace("in/g.jsonl", 5))
    assert caught.value.record == 5


def test_dropped_reasoning_in_a_prompt_does_not_matter(chat_tokenizer_dir) -> None:
    prompt = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "<think>hmm</think>a1"},
        {"role": "user", "content": "q2"},
    ]
    dpo = ChatEncoder(chat_tokenizer_dir("drops_reasoning"), train_type="dpo")
    pair = dpo.encode({"prompt": prompt, "chosen": "<think>ok</think>yes", "rejected": "no"})
    assert pair is not None
    assert trained_texts(dpo.chat, pair["chosen"], pair["chosen_mask"]) == ["<think>ok</think>yes<|im_end|>"]
    assert "hmm" not in dpo.chat.decode(pair["chosen"])  # the template dropped it: the model sees what it sees
    grpo = ChatEncoder(chat_tokenizer_dir("drops_reasoning"), train_type="grpo")
    group = grpo.encode({"prompt": prompt, "responses": ["<think>x</think>y"], "rewards": [0.5]})
    assert group is not None
    assert trained_texts(grpo.chat, group["responses"][0], group["masks"][0]) == ["<think>x</think>y<|im_end|>"]


def test_dpo_and_grpo_length_policies(chat_tokenizer_dir) -> None:
    directory = chat_tokenizer_dir("chatml")
    pair = {"prompt": CONVERSATION[:4], "chosen": "good answer " * 5, "rejected": "bad"}
    whole = ChatEncoder(directory, train_type="dpo").encode(pair)
    assert whole is not None
    limit = len(whole["chosen"]) - 3
    skip = ChatEncoder(directory, train_type="dpo", seq_len=limit)
    assert skip.encode(pair) is None and skip.stats.skipped_too_long == 1
    kept = ChatEncoder(directory, train_type="dpo", seq_len=limit, truncate="keep-start").encode(pair)
    assert kept is not None
    assert kept["chosen"].tolist() == whole["chosen"][:limit].tolist()
    assert kept["rejected"].tolist() == whole["rejected"].tolist()  # within the limit: untouched
    group = {"prompt": CONVERSATION[:2], "responses": ["short", "a much longer answer " * 4], "rewards": [0, 1]}
    full = ChatEncoder(directory, train_type="grpo").encode(group)
    assert full is not None
    prompt, longest = len(full["prompts"]), max(len(r) for r in full["responses"])
    start = ChatEncoder(directory, train_type="grpo", seq_len=prompt + longest - 4, truncate="keep-start")
    cut = start.encode(group)
    assert cut is not None
    assert cut["prompts"].tolist() == full["prompts"].tolist()
    assert [len(r) for r in cut["responses"]] == [len(full["responses"][0]), longest - 4]
    end = ChatEncoder(directory, train_type="grpo", seq_len=prompt + longest - 4, truncate="keep-end")
    cut = end.encode(group)
    assert cut is not None
    assert cut["prompts"].tolist() == full["prompts"][4:].tolist() and end.stats.truncated == 1
    assert ChatEncoder(directory, train_type="grpo", seq_len=prompt + longest - 1).encode(group) is None


def test_shipped_template_on_a_stdlib_conversation() -> None:
    from tokenloom.tokenize import default_tokenizer_path

    encoder = ChatEncoder(default_tokenizer_path(), chat_template=default_chat_template())
    tools = [{"type": "function", "function": {"name": "help", "parameters": {}}}]
    messages = [
        *turns("system: "),
        *CONVERSATION[1:3],
        *turns("user: Call help(len).", "assistant: Calling help."),
        *turns("tool: len(obj, /)\n    Return the number of items in a container."),
        *turns("assistant: \n  It returns the number of items.  \n"),
    ]
    sft = encoder.encode({"messages": messages, "tools": tools})
    assert sft is not None
    assert trained_texts(encoder.chat, sft["sequence"], sft["loss_mask"]) == [
        "It joins path components.<|endoftext|>",
        "Calling help.<|endoftext|>",
        "It returns the number of items.<|endoftext|>",
    ]


def test_an_empty_turn_the_template_leaves_out_trains_nothing(tmp_path: Path, chat_tokenizer_dir) -> None:
    encoder = _chatml_with(
        chat_tokenizer_dir,
        "{% for m in messages %}{% if m.content %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    messages = [CONVERSATION[1], {"role": "assistant", "content": ""}, *CONVERSATION[3:]]
    sft = encoder.encode({"messages": messages})
    assert sft is not None
    assert trained_texts(encoder.chat, sft["sequence"], sft["loss_mask"]) == [
        "Serialize an object to a JSON formatted str. ünïcode<|im_end|>"
    ]
    with pytest.raises(MaskError, match="no token is trained"):
        encoder.encode({"messages": messages[:2]})


def test_content_that_repeats_the_header_is_found_after_it(tmp_path: Path, chat_tokenizer_dir) -> None:
    template = tmp_path / "forced.jinja"
    template.write_text(FORCED_THINKING)
    encoder = ChatEncoder(chat_tokenizer_dir("chatml"), chat_template=template)
    messages = [{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "assistant"}]
    sft = encoder.encode({"messages": messages})
    assert sft is not None
    assert trained_texts(encoder.chat, sft["sequence"], sft["loss_mask"]) == ["assistant<|im_end|>"]
