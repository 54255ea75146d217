"""Review attacks on the chat masks: templates the first tests did not have, written here (not copied from a model).

Each template with ``{% generation %}`` tags is checked against transformers' ``return_assistant_tokens_mask``
and every record's tokens against ``apply_chat_template(tokenize=True)``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from tokenize_helpers import turns
from transformers import AutoTokenizer

from tokenloom.formats import ChatTemplateError, ConversationError
from tokenloom.tokenize.chat import ChatEncoder, RecordPlace, runs

IM = ["<|im_start|>", "<|im_end|>"]

#: [INST] turns, no header for the assistant; EOS after every assistant turn
INST = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
    "{% elif m.role == 'assistant' %}{% generation %}{{ m.content }}{{ eos_token }}{% endgeneration %}"
    "{% endif %}{% endfor %}"
)
#: the same, EOS only after the conversation's last assistant turn
INST_EOS_LAST = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
    "{% elif m.role == 'assistant' %}{{ m.content }}{% if loop.last %}{{ eos_token }}{% endif %}"
    "{% endif %}{% endfor %}"
)
#: ChatML-like with a default system prompt when the conversation has none
DEFAULT_SYSTEM = (
    "{% if messages[0].role != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}{% generation %}"
    "{{ m.content }}<|im_end|>{% endgeneration %}{% else %}{{ m.content }}<|im_end|>{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: tools rendered in the system turn; assistant tool calls between special markers; tool turns wrapped
TOOLS = (
    "{% if tools or messages[0].role == 'system' %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}"
    "{% if tools %}\nTools: {{ tools | tojson }}{% endif %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'system' and loop.first %}"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant\n{% generation %}{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
    "<|im_end|>{% endgeneration %}\n"
    "{% elif m.role == 'tool' %}<|im_start|>tool\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOL_SPECIALS = [*IM, "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
#: ChatML-like that appends <|endoftext|> to a finished conversation (not to one awaiting a reply)
EOS_AT_END = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}{% generation %}"
    "{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
    "<|im_end|>{% endgeneration %}{% else %}{{ m.content }}<|im_end|>{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% else %}<|endoftext|>{% endif %}"
)
#: Llama-3-like headers, BOS in the template, contents trimmed
HEADERS = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{% if m.role == 'assistant' %}{% generation %}{{ m.content | trim }}<|eot_id|>{% endgeneration %}"
    "{% else %}{{ m.content | trim }}<|eot_id|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
HEADER_SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

CALL = [{"type": "function", "function": {"name": "ls", "arguments": {"path": "/tmp"}}}]
TOOL_SCHEMAS = [{"type": "function", "function": {"name": "ls", "description": "list a directory", "parameters": {}}}]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """A tokenizer directory: the shipped BPE plus ``specials``, the given template, BOS/EOS, optionally a
    post-processor that adds BOS to every encoding (as Llama 3's tokenizer.json does)."""
    from tokenizers import AddedToken, Tokenizer, processors

    from tokenloom.tokenize import default_tokenizer_path

    def make(template: str, specials: list[str], *, bos: str | None = None, eos: str | None = None,
             bos_post_processor: bool = False) -> Path:  # fmt: skip
        directory = tmp_path_factory.mktemp("review-tok")
        tokenizer = Tokenizer.from_file(str(Path(default_tokenizer_path()) / "tokenizer.json"))
        tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
        if bos_post_processor:
            assert bos is not None, "a bos post-processor needs the bos token"
            bos_id = tokenizer.token_to_id(bos)
            tokenizer.post_processor = processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
            )
        tokenizer.save(str(directory / "tokenizer.json"))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
        config |= {
            "chat_template": template,
            **({"bos_token": bos} if bos else {}),
            **({"eos_token": eos} if eos else {}),
        }
        (directory / "tokenizer_config.json").write_bytes(orjson.dumps(config))
        return directory

    return make


def trained(encoder: ChatEncoder, sft: dict) -> list[str]:
    return [encoder.chat.decode(sft["sequence"][b:e]) for b, e in runs(sft["loss_mask"])]


def check_against_transformers(directory: Path, messages: list[dict], tools: list | None = None) -> list[str]:
    """Tokens equal apply_chat_template(tokenize=True), the mask equals its assistant mask; the trained texts."""
    hf = AutoTokenizer.from_pretrained(directory)
    reference = hf.apply_chat_template(
        messages, tools=tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    encoder = ChatEncoder(directory)
    sft = encoder.encode({"messages": messages, **({"tools": tools} if tools else {})})
    assert sft is not None
    assert sft["sequence"].tolist() == list(reference["input_ids"])
    assert sft["loss_mask"].tolist() == list(reference["assistant_masks"])
    assert 0 < sft["loss_mask"].sum() < len(sft["loss_mask"])
    return trained(encoder, sft)


def test_inst_template_without_an_assistant_header(tokenizer_dir) -> None:
    directory = tokenizer_dir(INST, ["<s>", "</s>", "[INST]", "[/INST]"], bos="<s>", eos="</s>")
    messages = [
        {"role": "user", "content": "Say INST and repeat me: 数据 😀"},
        {"role": "assistant", "content": "Say INST and repeat me: 数据 😀"},  # the user's text, verbatim
        {"role": "user", "content": "now empty"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "long"},
        {"role": "assistant", "content": "e\u0301 " + "word " * 400 + "end"},
    ]
    texts = check_against_transformers(directory, messages)
    assert texts[:2] == ["Say INST and repeat me: 数据 😀</s>", "</s>"]


def test_eos_only_after_the_last_turn_still_trains_a_stop_for_every_turn(tokenizer_dir) -> None:
    directory = tokenizer_dir(INST_EOS_LAST, ["<s>", "</s>", "[INST]", "[/INST]"], bos="<s>", eos="</s>")
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "content": "6"},
    ]
    encoder = ChatEncoder(directory)
    # an earlier turn stops on the next [INST] (what follows it in the rendering), the last on </s>
    sft = encoder.encode({"messages": messages})
    assert sft is not None
    assert trained(encoder, sft) == ["4[INST]", "6</s>"]


def test_default_system_prompt_and_an_assistant_first_turn(tokenizer_dir) -> None:
    """The content "system" also appears in the injected system turn: it is found in its own turn."""
    directory = tokenizer_dir(DEFAULT_SYSTEM, IM, eos="<|im_end|>")
    opening = [{"role": "assistant", "content": "system"}, {"role": "user", "content": "hi"}]
    assert check_against_transformers(directory, [*opening, {"role": "assistant", "content": "x"}]) == [
        "system<|im_end|>",
        "x<|im_end|>",
    ]
    again = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "You are a helpful assistant."}]
    assert check_against_transformers(directory, again) == ["You are a helpful assistant.<|im_end|>"]
    # an empty (or blank) first turn: only its <|im_end|>, not the injected system turn before it
    for blank in ("", "\u3000"):
        first = [{"role": "assistant", "content": blank}, {"role": "user", "content": "hi"}]
        assert check_against_transformers(directory, [*first, {"role": "assistant", "content": "x"}]) == [
            f"{blank}<|im_end|>",
            "x<|im_end|>",
        ]


def test_tool_calls_between_special_markers_train_through_the_turns_end(tokenizer_dir) -> None:
    """A special token inside the turn (<tool_call>) is not its end: the call and <|im_end|> are trained."""
    directory = tokenizer_dir(TOOLS, TOOL_SPECIALS, eos="<|im_end|>")
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "what is in /tmp"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": CALL},
        {"role": "tool", "content": "a b"},
        {"role": "assistant", "content": "", "tool_calls": CALL},
        {"role": "tool", "content": "a b"},
        {"role": "assistant", "content": "a and b"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "", "tool_calls": CALL},  # the conversation ends on a call
    ]
    call = '<tool_call>{"name": "ls", "arguments": {"path": "/tmp"}}</tool_call><|im_end|>'
    assert check_against_transformers(directory, messages, TOOL_SCHEMAS) == [
        f"Let me look.{call}",
        call,
        "a and b<|im_end|>",
        call,
    ]


def test_text_appended_to_a_finished_conversation_is_not_trained(tokenizer_dir) -> None:
    directory = tokenizer_dir(EOS_AT_END, [*IM, "<tool_call>", "</tool_call>", "<|endoftext|>"], eos="<|im_end|>")
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "ls"},
        {"role": "assistant", "content": "", "tool_calls": CALL},
    ]
    call = '<tool_call>{"name": "ls", "arguments": {"path": "/tmp"}}</tool_call><|im_end|>'
    assert check_against_transformers(directory, messages) == ["a<|im_end|>", call]
    assert check_against_transformers(directory, messages[:2]) == ["a<|im_end|>"]


def test_header_template_with_a_bos_adding_tokenizer(tokenizer_dir) -> None:
    """BOS in the template and in the tokenizer's post-processor: one BOS, as apply_chat_template(tokenize=True)."""
    directory = tokenizer_dir(
        HEADERS, HEADER_SPECIALS, bos="<|begin_of_text|>", eos="<|eot_id|>", bos_post_processor=True
    )
    hf = AutoTokenizer.from_pretrained(directory)
    assert hf("x")["input_ids"][0] == hf.convert_tokens_to_ids("<|begin_of_text|>")  # the tokenizer adds one
    messages = turns(
        "system: ",
        "user: héllo 👋🏽 e\u0301 数据\u3000",
        "assistant: \u3000 👋🏽 e\u0301 数据 héllo\u00a0\n",
        "user: assistant",
        "assistant: assistant",
    )
    assert check_against_transformers(directory, messages) == [
        "👋🏽 e\u0301 数据 héllo<|eot_id|>",
        "assistant<|eot_id|>",
    ]
    group = ChatEncoder(directory, train_type="grpo").encode(
        {"prompt": messages[:2], "responses": ["ok"], "rewards": [1]}
    )
    assert group is not None
    prompt = hf.apply_chat_template(messages[:2], add_generation_prompt=True, tokenize=True, return_dict=True)
    assert group["prompts"].tolist() == list(prompt["input_ids"])
    assert group["prompts"].tolist().count(hf.convert_tokens_to_ids("<|begin_of_text|>")) == 1


@pytest.mark.parametrize(
    "record",
    [
        {  # whole conversations that part at the user turn: not one prompt
            "chosen": [
                {"role": "system", "content": "s"},
                {"role": "user", "content": "Q1"},
                {"role": "assistant", "content": "A"},
            ],
            "rejected": [
                {"role": "system", "content": "s"},
                {"role": "user", "content": "Q2"},
                {"role": "assistant", "content": "B"},
            ],
        },
        {  # a prompt, and a chosen side that brings its own question
            "prompt": [{"role": "user", "content": "Q1"}],
            "chosen": [{"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A"}],
            "rejected": "B",
        },
    ],
)
def test_dpo_sides_with_different_prompts_are_a_record_error(record: dict, tokenizer_dir) -> None:
    encoder = ChatEncoder(tokenizer_dir(DEFAULT_SYSTEM, IM, eos="<|im_end|>"), train_type="dpo")
    with pytest.raises(ConversationError, match="different prompts") as caught:
        encoder.encode(record, RecordPlace("in/pairs.jsonl", 4))
    assert (caught.value.path, caught.value.record, caught.value.field) == ("in/pairs.jsonl", 4, "prompt")


@pytest.mark.parametrize("reward", [10**400, 1e39, -1e39], ids=["int-1e400", "1e39", "-1e39"])
def test_rewards_beyond_float32_are_a_record_error(reward, tokenizer_dir) -> None:
    """json.loads reads 1e400 written as digits as an int (OverflowError in isfinite); 1e39 would be inf as float32."""
    encoder = ChatEncoder(tokenizer_dir(DEFAULT_SYSTEM, IM, eos="<|im_end|>"), train_type="grpo")
    with pytest.raises(ConversationError, match="finite") as caught:
        encoder.encode({"prompt": "q", "responses": ["a"], "rewards": [reward]}, RecordPlace("in/g.jsonl", 2))
    assert (caught.value.record, caught.value.field) == (2, "rewards")
    group = encoder.encode({"prompt": "q", "responses": ["a"], "rewards": [3e38]})
    assert group is not None
    assert group["rewards"].tolist() == [pytest.approx(3e38)]


def test_dpo_keep_end_cuts_both_sides_alike(tokenizer_dir) -> None:
    """keep-end cut each side alone: the longer side lost prompt tokens the shorter kept, two prompts."""
    directory = tokenizer_dir(DEFAULT_SYSTEM, IM, eos="<|im_end|>")
    pair = {"prompt": "question " * 10, "chosen": "a long chosen answer " * 3, "rejected": "no"}
    whole = ChatEncoder(directory, train_type="dpo").encode(pair)
    assert whole is not None
    limit = len(whole["chosen"]) - 4
    encoder = ChatEncoder(directory, train_type="dpo", seq_len=limit, truncate="keep-end")
    cut = encoder.encode(pair)
    assert cut is not None
    for side in ("chosen", "rejected"):
        assert cut[side].tolist() == whole[side][4:].tolist()
        assert cut[f"{side}_mask"].tolist() == whole[f"{side}_mask"][4:].tolist()
    assert encoder.stats.truncated == 1 and len(cut["chosen"]) == limit
    prompt = int(whole["rejected_mask"].argmax())  # a cut that leaves no prompt: skipped, counted
    short = ChatEncoder(directory, train_type="dpo", seq_len=len(whole["chosen"]) - prompt, truncate="keep-end")
    assert short.encode(pair) is None and short.stats.skipped_too_long == 1


@pytest.mark.parametrize("expression", ["10 // (m.content | length)", "m.content.encode('no-such-codec')"])
def test_a_template_expression_that_raises_carries_the_record(expression: str, tokenizer_dir) -> None:
    """Not only Jinja's own errors: ZeroDivisionError, LookupError from the template's expressions too."""
    template = "{% for m in messages %}{{ m.content }}{{ " + expression + " }}<|im_end|>{% endfor %}"
    encoder = ChatEncoder(tokenizer_dir(DEFAULT_SYSTEM, IM, eos="<|im_end|>"), chat_template=template)
    record = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]}
    with pytest.raises(ChatTemplateError, match="raised") as caught:
        encoder.encode(record, RecordPlace("in/t.jsonl", 5))
    assert (caught.value.path, caught.value.record) == ("in/t.jsonl", 5)


#: the assistant header is part of every user turn: the generation prompt adds nothing
HEADER_IN_USER_TURN = (
    "{% for m in messages %}{% if m.role == 'user' %}<|user|>{{ m.content }}<|end|><|assistant|>"
    "{% elif m.role == 'assistant' %}{% generation %}{{ m.content }}<|end|>{% endgeneration %}"
    "{% else %}<|system|>{{ m.content }}<|end|>{% endif %}{% endfor %}"
)


def test_assistant_header_rendered_with_the_user_turn(tokenizer_dir) -> None:
    directory = tokenizer_dir(
        HEADER_IN_USER_TURN, ["<|user|>", "<|assistant|>", "<|system|>", "<|end|>"], eos="<|end|>"
    )
    messages = turns("system: s", "user: u2", "assistant: a", "user: u2", "assistant: u2")
    assert check_against_transformers(directory, messages) == ["a<|end|>", "u2<|end|>"]
    encoder = ChatEncoder(directory, train_type="grpo")
    group = encoder.encode({"prompt": messages[:2], "responses": ["x", ""], "rewards": [0, 1]})
    assert group is not None
    assert [encoder.chat.decode(r) for r in group["responses"]] == ["x<|end|>", "<|end|>"]
    assert all(m.all() for m in group["masks"])  # a response after its prompt: all of it is generated
