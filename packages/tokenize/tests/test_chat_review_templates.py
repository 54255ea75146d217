"""Templates the mask tests had not seen (review): a Gemma-style one (<start_of_turn>model, trimmed contents, no
system role) and a Phi-3-style one (<|end|> closes every turn, EOS only after a finished conversation). The masks
follow the rule of tokenloom.tokenize.chat._masks: each assistant content plus its end marker, nothing else."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from tokenloom.formats import ChatTemplateError
from tokenloom.tokenize.chat import ChatEncoder, runs

TURNS = [
    {"role": "user", "content": "What does os.path.join do?"},
    {"role": "assistant", "content": "It joins path components."},
    {"role": "user", "content": "And json.dumps? 😀"},
    {"role": "assistant", "content": "  Serialize to a JSON str.\n"},
]


def trained(encoder: ChatEncoder, record: dict) -> list[str]:
    arrays = encoder.encode(record)
    assert arrays is not None
    ids, mask = arrays["sequence"], arrays["loss_mask"]
    return [encoder.chat.decode(ids[b:e]) for b, e in runs(mask)]


@pytest.mark.parametrize("kind", ["turn_markers", "end_marker"])
def test_tokens_are_apply_chat_template(kind: str, chat_tokenizer_dir) -> None:
    directory = chat_tokenizer_dir(kind)
    expected = AutoTokenizer.from_pretrained(directory).apply_chat_template(TURNS, tokenize=True, return_dict=True)
    arrays = ChatEncoder(directory).encode({"messages": TURNS})
    assert arrays is not None and arrays["sequence"].tolist() == list(expected["input_ids"])


def test_gemma_style_trains_the_trimmed_contents_and_end_of_turn(chat_tokenizer_dir) -> None:
    encoder = ChatEncoder(chat_tokenizer_dir("turn_markers"))
    assert trained(encoder, {"messages": TURNS}) == [
        "It joins path components.<end_of_turn>",
        "Serialize to a JSON str.<end_of_turn>",  # the template trims; the newline after <end_of_turn> is masked
    ]
    assert trained(encoder, {"messages": [TURNS[0], {"role": "assistant", "content": ""}]}) == ["<end_of_turn>"]


def test_gemma_style_refusals_are_named_errors(chat_tokenizer_dir) -> None:
    encoder = ChatEncoder(chat_tokenizer_dir("turn_markers"))
    with pytest.raises(ChatTemplateError, match="System role not supported"):
        encoder.encode({"messages": [{"role": "system", "content": "s"}, *TURNS]})


def test_phi3_style_trains_end_not_the_eos_of_a_finished_conversation(chat_tokenizer_dir) -> None:
    encoder = ChatEncoder(chat_tokenizer_dir("end_marker"))
    assert trained(encoder, {"messages": TURNS}) == [
        "It joins path components.<|end|>",
        # the content's first space merged into the header's "\n" token is masked (the whitespace-edge rule)
        " Serialize to a JSON str.\n<|end|>",
    ]


GEMMA_PLAIN = """{{- bos_token -}}
{%- for message in messages -%}
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
{{- '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"""


def test_plain_text_turn_markers_train_the_end_marker_and_not_the_next_turns_first_token(tmp_path) -> None:
    """Gemma-style markers that are not special tokens (``<``, ``start``, ``_``, ... in the BPE): the trained
    tokens are each content and its ``<end_of_turn>``; not the newline after it, nor the next turn's ``<``."""
    import orjson
    from tokenizers import AddedToken, Tokenizer

    from tokenloom.tokenize import default_tokenizer_path

    tokenizer = Tokenizer.from_file(str(default_tokenizer_path() / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<bos>", "<eos>")])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
              "bos_token": "<bos>", "eos_token": "<eos>", "chat_template": GEMMA_PLAIN}  # fmt: skip
    (tmp_path / "tokenizer_config.json").write_bytes(orjson.dumps(config))
    encoder = ChatEncoder(tmp_path)
    assert encoder.chat.decode(encoder.chat.encode("<end_of_turn>")[0][:1]) == "<"  # plain text, several tokens
    assert trained(encoder, {"messages": TURNS}) == [
        "It joins path components.<end_of_turn>",
        "Serialize to a JSON str.<end_of_turn>",
    ]
    three = [*TURNS[:2], {"role": "user", "content": "ok"}]  # a user turn last: the assistant's end is its own
    assert trained(encoder, {"messages": three}) == ["It joins path components.<end_of_turn>"]
