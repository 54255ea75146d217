"""write_post_training: sft, dpo and grpo record stores through the keyed-store writer, with their counts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from tokenloom.formats import MaskError, open_records, open_store
from tokenloom.tokenize.chat import SIDECAR_NAME, ChatEncoder, RecordPlace, runs, write_post_training


def stored(record: dict[str, object], key: str) -> Any:
    """A key of a stored record: one array, or (a grouped key: grpo responses, masks) one array per response."""
    value = record[key]
    assert isinstance(value, np.ndarray) or (isinstance(value, list) and all(isinstance(v, np.ndarray) for v in value))
    return value


CHAT = [
    {"role": "system", "content": ""},
    {"role": "user", "content": "What does str.upper do?"},
    {"role": "assistant", "content": "Return a copy of the string converted to uppercase."},
]


def sft_records(n: int) -> list[dict]:
    return [
        {"messages": [*CHAT[:2], {"role": "assistant", "content": f"answer {i} " + "word " * (i % 7)}]}
        for i in range(n)
    ]


def test_sft_store(tmp_path: Path, chat_tokenizer_dir) -> None:
    directory = chat_tokenizer_dir("chatml")
    records = [*sft_records(5), {"messages": CHAT[:2]}, {"messages": CHAT}]  # one with no assistant turn
    stats = write_post_training(
        ((r, RecordPlace("in/c.jsonl", i + 1)) for i, r in enumerate(records)),
        tmp_path / "sft",
        "sft",
        tokenizer=directory,
        on_error="skip",
    )
    assert stats.records == 6 and stats.skipped_errors == 1 and stats.errors == {"MaskError": 1}
    store = open_records(tmp_path / "sft")
    assert len(store) == 6 and store.keys == ["loss_mask", "position_ids", "sequence"]
    encoder = ChatEncoder(directory)
    for i, record in enumerate([*records[:5], records[6]]):
        expected = encoder.encode(record)
        assert expected is not None
        got = store.record(i)
        assert np.array_equal(stored(got, "sequence"), expected["sequence"])
        assert np.array_equal(stored(got, "loss_mask"), expected["loss_mask"].astype(bool))
        assert stored(got, "position_ids").tolist() == list(range(len(expected["sequence"])))
    # the same files also open as an sft keyed store (one segment per conversation)
    keyed = open_store(tmp_path / "sft")
    assert len(keyed) == sum(len(stored(store.record(i), "sequence")) for i in range(6))
    sidecar = orjson.loads((tmp_path / "sft" / SIDECAR_NAME).read_bytes())
    assert sidecar["train_type"] == "sft" and sidecar["stats"]["skipped_errors"] == 1
    assert sidecar["stats"]["trained_tokens"] == stats.trained_tokens > 0


def test_sft_error_publishes_nothing(tmp_path: Path, chat_tokenizer_dir) -> None:
    with pytest.raises(MaskError) as caught:
        write_post_training(
            [(r, RecordPlace("in/c.jsonl", i + 1)) for i, r in enumerate([*sft_records(3), {"messages": CHAT[:2]}])],
            tmp_path / "sft",
            "sft",
            tokenizer=chat_tokenizer_dir("chatml"),
        )
    assert caught.value.path == "in/c.jsonl" and caught.value.record == 4
    out = tmp_path / "sft"
    assert not (out / "meta.json").exists() and not (out / SIDECAR_NAME).exists()
    assert not [p for p in out.iterdir() if p.name.endswith(".bin")] if out.exists() else True


def test_truncation_counts_in_the_sidecar(tmp_path: Path, chat_tokenizer_dir) -> None:
    records = sft_records(8)
    first = ChatEncoder(chat_tokenizer_dir("chatml")).encode(records[0])
    assert first is not None
    lengths = [len(first["sequence"])]
    stats = write_post_training(
        records, tmp_path / "s", "sft", tokenizer=chat_tokenizer_dir("chatml"), seq_len=lengths[0] + 2
    )
    assert stats.skipped_too_long > 0 and stats.records + stats.skipped_too_long == 8
    assert len(open_records(tmp_path / "s")) == stats.records
    sidecar = orjson.loads((tmp_path / "s" / SIDECAR_NAME).read_bytes())
    assert sidecar["max_length"] == lengths[0] + 2 and sidecar["truncate"] == "skip"
    assert sidecar["stats"]["skipped_too_long"] == stats.skipped_too_long


def test_dpo_store(tmp_path: Path, chat_tokenizer_dir) -> None:
    pairs = [{"prompt": CHAT[:2], "chosen": f"good {i}", "rejected": "bad " * (i + 1)} for i in range(4)]
    write_post_training(pairs, tmp_path / "dpo", "dpo", tokenizer=chat_tokenizer_dir("header_bos"))
    store = open_records(tmp_path / "dpo")
    assert len(store) == 4 and store.keys == ["chosen", "chosen_mask", "rejected", "rejected_mask"]
    encoder = ChatEncoder(chat_tokenizer_dir("header_bos"), train_type="dpo")
    for i, pair in enumerate(pairs):
        got, expected = store.record(i), encoder.encode(pair)
        assert expected is not None
        for key in expected:
            value = stored(got, key)
            assert value.tolist() == expected[key].astype(value.dtype).tolist()
        trained = [encoder.chat.decode(stored(got, "rejected")[b:e]) for b, e in runs(stored(got, "rejected_mask"))]
        assert trained == [("bad " * (i + 1)).strip() + "<|eot_id|>"]


def test_grpo_store_keeps_groups(tmp_path: Path, chat_tokenizer_dir) -> None:
    groups = [
        {"prompt": "q0", "responses": ["a", "bb", "ccc"], "rewards": [1.0, 0.0, 0.5]},
        {"prompt": CHAT[:2], "responses": ["only"], "rewards": [-1]},
    ]
    write_post_training(groups, tmp_path / "grpo", "grpo", tokenizer=chat_tokenizer_dir("chatml"))
    store = open_records(tmp_path / "grpo")
    assert len(store) == 2
    first, second = store.record(0), store.record(1)
    assert len(stored(first, "responses")) == 3 and len(stored(second, "responses")) == 1
    assert stored(first, "rewards").tolist() == [1.0, 0.0, 0.5] and stored(second, "rewards").tolist() == [-1.0]
    chat = ChatEncoder(chat_tokenizer_dir("chatml"), train_type="grpo").chat
    responses, masks = stored(first, "responses"), stored(first, "masks")
    for response, mask, text in zip(responses, masks, ["a", "bb", "ccc"], strict=True):
        assert [chat.decode(response[b:e]) for b, e in runs(mask)] == [f"{text}<|im_end|>"]
    assert chat.decode(stored(first, "prompts")).endswith("<|im_start|>assistant\n")


def test_chat_encoding_imports_no_torch() -> None:
    """A data-prep box has no torch: loading the tokenizer and encoding a record must not import it."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from tokenloom.tokenize import default_tokenizer_path\n"
        "from tokenloom.tokenize.chat import ChatEncoder, default_chat_template\n"
        "e = ChatEncoder(default_tokenizer_path(), chat_template=default_chat_template())\n"
        "assert e.encode({'messages': [{'role': 'user', 'content': 'a'}, {'role': 'assistant', 'content': 'b'}]})\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.strip() == "False", done.stderr
