"""--astrai-config: AstrAI's preprocessing config gives the arrays AstrAI's ``Pipeline`` writes.

Each test states one documented rule of AstrAI's builder and pipeline (``astrai/preprocessing/builder.py``,
``pipeline.py``, ``packing.py``, ``docs/guides/preprocessing.md``) and computes the expected arrays from
that rule with ``tokenizers`` directly; configs are written by the tests.
"""

from __future__ import annotations

import random
from pathlib import Path

import jinja2
import numpy as np
import orjson
import pytest
from tokenize_helpers import turns
from tokenizers import AddedToken, Tokenizer
from tokenizers.processors import TemplateProcessing

from tokenloom.formats import ChatTemplateError, ConfigError, ConversationError, RecordStoreWriter, open_records
from tokenloom.tokenize import default_tokenizer_path
from tokenloom.tokenize.chat import AstraiConfig, AstraiEncoder, records_from_astrai_config

#: ChatML-style, written for these tests; ``loop.first`` shows the per-message rendering
TEMPLATE = (
    "{% for m in messages %}{% if loop.first %}[first]{% endif %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
)
SPECIALS = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CHAT = turns("system: You are helpful.", "user: Hi", "assistant: Hello!", "tool: 42", "assistant: It is 42.")
SFT_CHAT = {
    "input": {"sections": [{"field": "messages", "action": "$role", "template": True}]},
    "mask": {"system": "mask", "user": "mask", "assistant": "train"},
    "mask_default": "mask",
    "preprocessing": {"max_seq_len": 2048},
    "output": {"storage_format": "bin", "dtype": {"loss_mask": "bool"}},
}


def make_dir(tmp_path: Path, *, bos: bool = True, post_bos: bool = False, template: str | None = TEMPLATE) -> Path:
    directory = tmp_path / f"tok-{bos}-{post_bos}-{template is None}"
    directory.mkdir()
    tokenizer = Tokenizer.from_file(str(Path(default_tokenizer_path()) / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    if post_bos:  # a post-processor that adds <s> (what add_special_tokens switches on)
        tokenizer.post_processor = TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tokenizer.token_to_id("<s>"))]
        )
    tokenizer.save(str(directory / "tokenizer.json"))
    config: dict = {"bos_token": "<s>"}  # Hugging Face's key: AstrAI does not read it
    if bos:
        config["special_tokens"] = {"bos_token": "<s>", "eos_token": "</s>"}
    if template is not None:
        config["chat_template"] = template
    (directory / "tokenizer_config.json").write_bytes(orjson.dumps(config))
    return directory


def reference(directory: Path) -> Tokenizer:
    return Tokenizer.from_file(str(directory / "tokenizer.json"))


def enc(tok: Tokenizer, text: str, special: bool = False) -> list[int]:
    return tok.encode(text, add_special_tokens=special).ids


def one_message(message: dict) -> str:
    """AstrAI's ChatTemplate.render: plain Jinja, messages=[message], add_generation_prompt=False."""
    return jinja2.Template(TEMPLATE).render(messages=[message], add_generation_prompt=False)


def run(config: dict, records: list, directory: Path, **options) -> list[dict]:
    return list(records_from_astrai_config(AstraiConfig.from_dict(config), records, directory, **options))


def test_sft_chat_renders_each_message_alone_with_bos_and_role_masks(tmp_path: Path) -> None:
    directory = make_dir(tmp_path)
    tok = reference(directory)
    [out] = run(SFT_CHAT, [{"messages": CHAT}], directory)
    ids, mask = [tok.token_to_id("<s>")], [0]
    for message in CHAT:  # each message rendered on its own: every one is loop.first
        piece = enc(tok, one_message(message))
        ids += piece
        # AstrAI: mask[role], else mask_default ("tool" is not listed: masked)
        mask += [int(message["role"] == "assistant")] * len(piece)
    assert one_message(CHAT[2]).startswith("[first]<|im_start|>assistant")
    assert out["sequence"].tolist() == ids
    assert out["loss_mask"].tolist() == mask
    assert out["position_ids"].tolist() == list(range(len(ids)))  # doc_reset, the default
    assert sorted(out) == ["loss_mask", "position_ids", "sequence"]


def test_bos_only_from_astrai_special_tokens(tmp_path: Path) -> None:
    """AstrAI's bos_token_id comes from tokenizer_config.json's special_tokens map, not the top-level key."""
    directory = make_dir(tmp_path, bos=False)
    tok = reference(directory)
    [out] = run(SFT_CHAT, [{"messages": CHAT[:3]}], directory)
    assert out["sequence"].tolist() == [i for m in CHAT[:3] for i in enc(tok, one_message(m))]


def test_plain_jinja_options(tmp_path: Path) -> None:
    """AstrAI compiles jinja2.Template(text): no trim_blocks (a newline after a tag stays), bos_token undefined."""
    template = "{% for m in messages %}\n{{ bos_token }}<|im_start|>{{ m.role }} {{ m.content }}<|im_end|>{% endfor %}"
    directory = make_dir(tmp_path, template=template, bos=False)
    tok = reference(directory)
    [out] = run(SFT_CHAT, [{"messages": CHAT[1:3]}], directory)
    expected = [i for m in CHAT[1:3] for i in enc(tok, f"\n<|im_start|>{m['role']} {m['content']}<|im_end|>")]
    assert out["sequence"].tolist() == expected


def test_chat_template_override(tmp_path: Path) -> None:
    directory = make_dir(tmp_path, template=None)
    with pytest.raises(ConfigError, match="no chat template"):
        run(SFT_CHAT, [{"messages": CHAT}], directory)
    file = tmp_path / "t.jinja"
    file.write_text(TEMPLATE)
    [out] = run(SFT_CHAT, [{"messages": CHAT}], directory, chat_template=file)
    [want] = run(SFT_CHAT, [{"messages": CHAT}], make_dir(tmp_path))
    assert out["sequence"].tolist() == want["sequence"].tolist()


def test_sft_instruction_sections(tmp_path: Path) -> None:
    """Text sections: the first one gets the post-processor's special tokens, later ones none (AstrAI's default)."""
    directory = make_dir(tmp_path, post_bos=True)
    tok = reference(directory)
    config = {
        "input": {"sections": [{"field": "prompt", "action": "mask"}, {"field": "response", "action": "train"}]},
        "preprocessing": {"max_seq_len": 2048},
    }
    record = {"prompt": "Translate to French: Hello", "response": "Bonjour"}
    [out] = run(config, [record], directory)
    prompt, response = enc(tok, record["prompt"], True), enc(tok, record["response"])
    assert prompt[0] == tok.token_to_id("<s>")
    assert out["sequence"].tolist() == prompt + response
    assert out["loss_mask"].tolist() == [0] * len(prompt) + [1] * len(response)
    # add_special_tokens set per section; a blank first field is left out and the next one is "first"
    config["input"]["sections"][0]["add_special_tokens"] = False
    [out] = run(config, [record], directory)
    assert out["sequence"].tolist() == enc(tok, record["prompt"]) + response
    del config["input"]["sections"][0]["add_special_tokens"]
    [out] = run(config, [{"prompt": "   ", "response": "Bonjour"}], directory)
    assert out["sequence"].tolist() == enc(tok, "Bonjour", True)
    # a record whose tokens are all trained keeps a loss_mask of ones (AstrAI's writer would pad it with zeros)
    assert out["loss_mask"].tolist() == [1] * len(out["sequence"])
    # a value that is not text is str()-ed, as AstrAI does
    [out] = run(config, [{"prompt": 12, "response": None}], directory)
    assert out["sequence"].tolist() == enc(tok, "12", True) + enc(tok, "None")


def test_pretrain_text_config(tmp_path: Path) -> None:
    """A text config (no template, all train): no loss_mask; texts outside [min_chars, max_chars] skipped."""
    directory = make_dir(tmp_path)
    tok = reference(directory)
    config = {
        "input": {"sections": [{"field": "text", "action": "train"}]},
        "preprocessing": {"max_seq_len": 8192, "min_chars": 10, "max_chars": 40},
    }
    records = [{"text": "short"}, {"text": "Artificial Intelligence is a field"}, {"text": "x" * 41}, {}]
    encoder = AstraiEncoder(AstraiConfig.from_dict(config), directory)
    outs = [encoder.encode(r) for r in records]
    assert outs[0] is None and outs[2] is None and outs[3] is None
    assert encoder.train_type == "seq" and encoder.stats.dropped_empty == 3 and encoder.stats.records == 1
    kept = outs[1]
    assert kept is not None and sorted(kept) == ["position_ids", "sequence"]
    assert kept["sequence"].tolist() == enc(tok, records[1]["text"])


def test_cuts_and_position_ids(tmp_path: Path) -> None:
    """max_seq_len keeps the start; then max_packed_len cuts every key by truncation_mode (position ids too)."""
    directory = make_dir(tmp_path)
    tok = reference(directory)
    text = " ".join(f"word{i}" for i in range(200))
    full = enc(tok, text, True)
    config = {
        "input": {"sections": [{"field": "text", "action": "train"}]},
        "preprocessing": {"max_seq_len": 100, "max_packed_len": 30, "truncation_mode": "keep_end", "min_chars": 0},
    }
    [out] = run(config, [{"text": text}], directory)
    assert out["sequence"].tolist() == full[:100][-30:]
    assert out["position_ids"].tolist() == list(range(70, 100))
    config["preprocessing"]["truncation_mode"] = "keep_start"
    [out] = run(config, [{"text": text}], directory)
    assert out["sequence"].tolist() == full[:30] and out["position_ids"].tolist() == list(range(30))


def test_position_modes_and_max_items(tmp_path: Path) -> None:
    directory = make_dir(tmp_path)
    records = [{"messages": CHAT[1:3]}, {"messages": CHAT[:3]}, {"messages": []}, {"messages": CHAT[1:3]}]
    base = run(SFT_CHAT, records, directory)
    lengths = [len(r["sequence"]) for r in base]
    assert len(base) == 3  # a record with no messages is only BOS: skipped
    none = run({**SFT_CHAT, "output": {"position_ids_mode": "none"}}, records, directory)
    assert all("position_ids" not in r for r in none)
    # continuous: one run of positions over a shard's records; a new shard once its tokens reach the limit
    shard = lengths[0] + lengths[1]
    output = {"position_ids_mode": "continuous", "max_tokens_per_shard": shard}
    cont = run({**SFT_CHAT, "output": output}, records, directory)
    starts = [int(r["position_ids"][0]) for r in cont]
    assert starts == [0, lengths[0], 0]
    assert all(np.array_equal(np.diff(r["position_ids"]), np.ones(len(r["sequence"]) - 1)) for r in cont)
    limited = AstraiEncoder(AstraiConfig.from_dict({**SFT_CHAT, "preprocessing": {"max_items": 2}}), directory)
    kept = [limited.encode(r) for r in records]
    assert [k is not None for k in kept] == [True, True, False, False]
    # the run stops at the limit: the records after it are not looked at (the empty one is not counted as empty)
    assert limited.stats.dropped_max_items == 2 and limited.stats.dropped_empty == 0


def test_bad_records_are_named(tmp_path: Path) -> None:
    directory = make_dir(tmp_path)
    from tokenloom.tokenize.chat import RecordPlace

    encoder = AstraiEncoder(AstraiConfig.from_dict(SFT_CHAT), directory)
    with pytest.raises(ConversationError, match=r"messages\[1\] is str") as caught:
        encoder.encode({"messages": [CHAT[0], "hi"]}, RecordPlace("in.jsonl", 7))
    assert caught.value.path is not None and caught.value.record == 7
    broken = make_dir(tmp_path, template="{{ messages[0].content.nope() }}", bos=False)
    with pytest.raises(ChatTemplateError, match="rendering message 0"):
        AstraiEncoder(AstraiConfig.from_dict(SFT_CHAT), broken).encode({"messages": CHAT})
    skipping = AstraiEncoder(AstraiConfig.from_dict(SFT_CHAT), directory, on_error="skip")
    assert skipping.encode(["not", "an", "object"]) is None
    assert skipping.stats.skipped_errors == 1 and skipping.stats.errors == {"ConversationError": 1}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"input": {"sources": {"chosen": {"sections": []}}}}, "input.sources"),
        ({"preprocessing": {"packing_strategy": "bfd"}}, "preprocessing.packing_strategy"),
        ({"output": {"domain_key": "domain"}}, "output.domain_key"),
        ({"output": {"position_ids_mode": "sometimes"}}, "output.position_ids_mode"),
        ({"preprocessing": {"max_seq_length": 10}}, "preprocessing"),
        ({"mask": {"assistant": "trian"}}, "mask"),
        ({"input": {"sections": [{"field": "messages", "action": "trian"}]}}, "input.sections[0]"),
        ({"input": {"sections": [{"field": "rewards", "action": "value"}]}}, "input.sections[0]"),
        ({"input": {"sections": []}}, "input.sections"),
        ({"version": 2}, "version"),
        ({"preprocessing": {"max_seq_len": 0}}, "max_seq_len"),
        ({"extra": 1}, "the config"),
    ],
)
def test_config_errors(tmp_path: Path, change: dict, field: str) -> None:
    path = tmp_path / "pipeline.json"
    path.write_bytes(orjson.dumps({**SFT_CHAT, **change}))
    with pytest.raises(ConfigError) as caught:
        AstraiConfig.from_file(path)
    assert caught.value.field == field and caught.value.path is not None


def test_engines_give_the_same_arrays(tmp_path: Path) -> None:
    """The messages' texts go through tokenize's engine: fastokens (proven equal) and hf give the same arrays."""
    directory = make_dir(tmp_path)
    rng = random.Random(3)
    words = ["def", " name", "λx", " 数据", "\n", "  ", "😀", "é", " the", ".", "<|im_end|>", "   x"]
    records = [
        {"messages": [{"role": rng.choice(["system", "user", "assistant", "tool"]),
                       "content": "".join(rng.choices(words, k=rng.randint(0, 30)))} for _ in range(rng.randint(1, 6))]}
        for _ in range(200)
    ]  # fmt: skip
    fast = AstraiEncoder(AstraiConfig.from_dict(SFT_CHAT), directory, engine="fast")
    assert fast.chat.encoder.name == "fast"
    hf = run(SFT_CHAT, records, directory, engine="hf")
    got = [a for a in (fast.encode(r) for r in records) if a is not None]
    assert len(got) == len(hf) == 200
    for a, b in zip(got, hf, strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in b)


def test_written_store_reads_back(tmp_path: Path) -> None:
    directory = make_dir(tmp_path)
    arrays = run(SFT_CHAT, [{"messages": CHAT}, {"messages": CHAT[:3]}], directory)
    writer = RecordStoreWriter(tmp_path / "out", train_type="sft", dtype=np.uint16, vocab_size=1 << 16,
                               key_dtypes={"loss_mask": "bool"})  # fmt: skip
    for a in arrays:
        writer.add_record(a)
    writer.close()
    store = open_records(tmp_path / "out")
    assert len(store) == 2


def _cli(*args: str) -> tuple[int, str]:
    from click.testing import CliRunner

    from tokenloom.tokenize._commands import tokenize

    result = CliRunner().invoke(tokenize, list(args))
    return result.exit_code, result.output


def test_cli_flag(tmp_path: Path) -> None:
    """--astrai-config: the config is read and checked up front; the run writes what records_from_astrai_config
    gives once tokenize's record transform takes it (the hook in ChatTransform), and says so until then."""

    directory = make_dir(tmp_path)
    (tmp_path / "in").mkdir()
    records = [{"messages": CHAT}, {"messages": CHAT[:3]}]
    (tmp_path / "in" / "a.jsonl").write_bytes(b"\n".join(orjson.dumps(r) for r in records) + b"\n")
    config = tmp_path / "pipeline.json"
    common = ["--input-dir", str(tmp_path / "in"), "--tokenizer", str(directory), "--astrai-config", str(config)]
    config.write_bytes(orjson.dumps({**SFT_CHAT, "mask": {"assistant": "trian"}}))
    code, output = _cli(*common, "--output-dir", str(tmp_path / "bad"))
    assert code != 0 and "trian" in output
    config.write_bytes(orjson.dumps(SFT_CHAT))
    for extra in (["--seq-len", "10"], ["--train-type", "dpo"], ["--truncate", "keep-end"]):
        code, output = _cli(*common, "--output-dir", str(tmp_path / "bad"), *extra)
        assert code != 0 and "astrai" in output.lower(), output
    code, output = _cli(*common, "--output-dir", str(tmp_path / "out"))
    assert code == 0, output
    store = open_records(tmp_path / "out")
    want = run(SFT_CHAT, records, directory)
    for i, arrays in enumerate(want):
        got = store.record(i)
        assert all(np.array_equal(np.asarray(got[k]), arrays[k]) for k in arrays)
