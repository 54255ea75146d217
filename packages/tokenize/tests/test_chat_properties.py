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


def same_but_leading_space(found: list[str], expected: list[str]) -> bool:
    """Each trained piece is the expected one, or it without some leading whitespace (a token of the content's
    leading whitespace merged with the header's is masked: tokenloom.tokenize.chat._masks point 4)."""
    return len(found) == len(expected) and all(
        want.endswith(got) and not want[: len(want) - len(got)].strip()
        for got, want in zip(found, expected, strict=True)
    )


@pytest.mark.parametrize("kind", ["chatml", "header_bos", "generation_tags", "next_role_marker"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=conversations())
def test_random_conversations(kind: str, messages, chat_tokenizer_dir) -> None:
    encoder = encoder_for(str(chat_tokenizer_dir(kind)))
    hf = encoder.chat.hf
    sft = encoder.encode({"messages": messages})  # a content's leading whitespace no longer straddles
    assert sft is not None
    ids, mask = sft["sequence"], sft["loss_mask"]
    assert ids.tolist() == list(hf.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
    assert 0 < int(mask.sum()) < len(mask)
    found = [encoder.chat.decode(ids[b:e]) for b, e in runs(mask)]
    assert same_but_leading_space(found, expected_pieces(kind, messages))
    if kind == "generation_tags":
        reference = np.asarray(
            hf.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)[
                "assistant_masks"
            ]
        )
        # equal, but where a content's leading whitespace shares a token with the header: transformers trains
        # that token (header text included), tokenloom masks it
        differ = np.flatnonzero(mask != reference)
        assert all(reference[i] == 1 and not encoder.chat.decode(ids[i : i + 1]).strip() for i in differ)
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
    pair = dpo.encode({"prompt": prompt, "chosen": answers[0], "rejected": answers[1]})
    assert pair is not None
    for side, text in (("chosen", expect[0]), ("rejected", expect[1])):
        assert same_but_leading_space([dpo.chat.decode(pair[side][b:e]) for b, e in runs(pair[f"{side}_mask"])], [text])
    grpo = typed_encoder(directory, "grpo")
    group = grpo.encode({"prompt": prompt, "responses": answers, "rewards": list(range(len(answers)))})
    assert group is not None
    hf = grpo.chat.hf
    for answer, response, mask, text in zip(answers, group["responses"], group["masks"], expect, strict=True):
        whole = hf.apply_chat_template([*prompt, {"role": "assistant", "content": answer}], tokenize=False)
        assert grpo.chat.decode(group["prompts"]) + grpo.chat.decode(response) == whole
        assert [grpo.chat.decode(response[b:e]) for b, e in runs(mask)] == [text]


#: [INST] turns with spaces around the contents, for a Metaspace (SentencePiece-style) tokenizer
INST_SPACED = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]"
    "{% elif m.role == 'assistant' %} {{ m.content }}{{ eos_token }}{% endif %}{% endfor %}"
)
SPACED_WORDS = st.lists(st.sampled_from(["the", " quick", "fox", "  ", " ", "数据", "é", "hello", "lazy"]), max_size=10)


@pytest.fixture(scope="module")
def metaspace_dir(tmp_path_factory: pytest.TempPathFactory):
    """A small BPE trained here with the Metaspace pre-tokenizer and decoder (SentencePiece-style spaces)."""
    import random

    import orjson
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "lazy",
        "dog",
        "hello",
        "world",
        "data",
        "model",
        "token",
        "answer",
        "数据",
        "é",
    ]
    rng = random.Random(0)
    corpus = [" ".join(rng.choices(words, k=12)) for _ in range(500)]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    specials = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"]
    tokenizer.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=specials))
    directory = tmp_path_factory.mktemp("metaspace")
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "clean_up_tokenization_spaces": False,
        "chat_template": INST_SPACED,
    }
    (directory / "tokenizer_config.json").write_bytes(orjson.dumps(config))
    return directory


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=st.lists(st.tuples(SPACED_WORDS.map("".join), SPACED_WORDS.map("".join)), min_size=1, max_size=3))
def test_metaspace_inst_template(turns, metaspace_dir) -> None:
    """``[/INST] {{ content }}`` under Metaspace: the separating space lives in the content's first token, which
    is trained whole; every record is verified and its tokens are transformers' ``apply_chat_template``."""
    messages = [m for user, answer in turns for m in ({"role": "user", "content": user},
                                                       {"role": "assistant", "content": answer})]  # fmt: skip
    encoder = encoder_for(str(metaspace_dir))
    sft = encoder.encode({"messages": messages})
    assert sft is not None
    ids, mask = sft["sequence"], sft["loss_mask"]
    hf = encoder.chat.hf
    assert ids.tolist() == list(hf.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
    assert len(runs(mask)) <= len(turns)
    # the trained tokens, decoded in place, are each answer (with the separating space) and </s>
    whole = encoder.chat.decode(ids)
    for begin, end in runs(mask):
        piece = whole[len(encoder.chat.decode(ids[:begin])) : len(encoder.chat.decode(ids[:end]))]
        assert piece.endswith("</s>")
        assert any(f" {m['content']}".endswith(piece[:-4].lstrip(" ")) for m in messages if m["role"] == "assistant")


@cache
def engine_encoder(directory: str, engine: str) -> ChatEncoder:
    return ChatEncoder(directory, engine=engine)


@pytest.mark.parametrize("kind", ["chatml", "header_bos", "generation_tags", "next_role_marker"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=conversations())
def test_fast_engine_gives_the_same_records(kind: str, messages, chat_tokenizer_dir) -> None:
    """The renderings encoded by fastokens (ids; offsets summed from token bytes) give the records hf gives."""
    directory = str(chat_tokenizer_dir(kind))
    fast, hf = engine_encoder(directory, "fast"), engine_encoder(directory, "hf")
    assert fast.chat.engine == "fast" and hf.chat.engine == "hf"
    a, b = fast.encode({"messages": messages}), hf.encode({"messages": messages})
    assert a is not None and b is not None
    assert all(np.array_equal(a[key], b[key]) for key in b)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.lists(st.one_of(TEXT, st.sampled_from(["<|im_start|>", "<|im_end|>", "a😀b", "🇫🇷", "\u200d"]))).map("".join)
)
def test_fast_offsets_are_tokenizers_offsets(text: str, chat_tokenizer_dir) -> None:
    chat = engine_encoder(str(chat_tokenizer_dir("chatml")), "fast").chat
    ids, offsets = chat.encode(text)
    reference = chat.hf.backend_tokenizer.encode(text, add_special_tokens=False)
    assert ids.tolist() == reference.ids
    assert offsets.tolist() == [list(span) for span in reference.offsets]


def test_engine_fast_refused_where_offsets_cannot_be_summed(metaspace_dir) -> None:
    from tokenloom.formats import ConfigError

    assert ChatEncoder(str(metaspace_dir)).chat.engine == "hf"  # auto: hf, with the reason
    with pytest.raises(ConfigError, match="not ByteLevel"):
        ChatEncoder(str(metaspace_dir), engine="fast")


def test_fast_engine_not_used_with_stripping_added_tokens(tmp_path) -> None:
    """An added token that takes in the whitespace beside it holds more than its text: offsets cannot be summed."""
    import orjson
    from tokenizers import AddedToken, Tokenizer

    from tokenloom.tokenize import default_tokenizer_path

    tokenizer = Tokenizer.from_file(f"{default_tokenizer_path()}/tokenizer.json")
    tokenizer.add_special_tokens(
        [AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True, lstrip=True)]
    )
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }} <|im_end|>\n{% endfor %}"
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "chat_template": template}
    (tmp_path / "tokenizer_config.json").write_bytes(orjson.dumps(config))
    chat = ChatEncoder(str(tmp_path)).chat
    assert chat.engine == "hf" and "whitespace beside them" in chat.engine_reason
