"""``tokenloom inspect OUT --records N`` on post-training stores: decoded records, trained spans marked, counts."""

from __future__ import annotations

from pathlib import Path

import orjson
from click.testing import CliRunner

from tokenloom.formats.cli.commands import inspect
from tokenloom.tokenize.chat import write_post_training

MESSAGES = [
    {"role": "user", "content": "What does math.sqrt do?"},
    {"role": "assistant", "content": "Return the square root of x."},
]


def test_sft_records_shown_with_trained_spans(tmp_path: Path, chat_tokenizer_dir) -> None:
    records = [{"messages": MESSAGES}] * 4 + [{"messages": [*MESSAGES, *MESSAGES]}] * 2
    write_post_training(records, tmp_path / "sft", "sft", tokenizer=chat_tokenizer_dir("chatml"), seq_len=30)
    result = CliRunner().invoke(inspect, [str(tmp_path / "sft"), "--records", "3"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "4 records" in out and "skipped (too long) 2" in out and "truncated 0" in out
    assert out.count("── record") == 3
    assert "<|im_start|>user\nWhat does math.sqrt do?<|im_end|>" in out
    assert "\u27e6Return the square root of x.<|im_end|>\u27e7" in out  # the trained span, marked
    assert "mask share" in out and "max_length 30" in out


def test_dpo_and_grpo_records_and_json(tmp_path: Path, chat_tokenizer_dir) -> None:
    directory = chat_tokenizer_dir("header_bos")
    write_post_training(
        [{"prompt": "q", "chosen": "yes", "rejected": "no"}], tmp_path / "dpo", "dpo", tokenizer=directory
    )
    out = CliRunner().invoke(inspect, [str(tmp_path / "dpo"), "--records", "1"]).output
    assert "record 0 · chosen" in out and "record 0 · rejected" in out
    assert "\u27e6yes<|eot_id|>\u27e7" in out and "\u27e6no<|eot_id|>\u27e7" in out
    write_post_training(
        [{"prompt": "q", "responses": ["a", "b"], "rewards": [1, 0]}], tmp_path / "grpo", "grpo", tokenizer=directory
    )
    result = CliRunner().invoke(inspect, [str(tmp_path / "grpo"), "--records", "5", "--json"])
    facts = orjson.loads(result.output)
    assert facts["records"] == 1 and [s["key"] for s in facts["shown"][0]["sides"]] == [
        "prompts",
        "responses[0]",
        "responses[1]",
    ]
    assert facts["shown"][0]["sides"][1]["pieces"] == [["a<|eot_id|>", True]]


def test_records_of_a_token_dataset_is_a_clean_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(inspect, [str(tmp_path), "--records", "2"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "meta.json" in result.output
