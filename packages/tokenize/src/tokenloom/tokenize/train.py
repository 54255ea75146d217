"""Train a byte-level BPE tokenizer and save it in Hugging Face format.

Used by ``tools/corpus/train_tokenizer.py`` to build the tokenizer shipped in
``tokenloom/tokenize/assets/`` and by tests that need a tokenizer of another
vocabulary size. The result loads with ``AutoTokenizer.from_pretrained(path)``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import orjson

from tokenloom.formats import ConfigError

__all__ = ["EOS_TOKEN", "train_byte_level_bpe"]

EOS_TOKEN = "<|endoftext|>"


def train_byte_level_bpe(
    texts: Iterable[str],
    out_dir: str | os.PathLike[str],
    *,
    vocab_size: int = 16384,
    min_frequency: int = 2,
    eos_token: str = EOS_TOKEN,
    model_max_length: int = 1 << 20,
) -> Path:
    """Train on ``texts`` and write tokenizer.json, tokenizer_config.json, special_tokens_map.json.

    The EOS token gets id 0 and doubles as the pad token. Training is
    deterministic for the same texts and settings.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 257:
        raise ConfigError(
            f"vocab_size is {vocab_size}, expected >= 257 (256 byte symbols and the EOS token)",
            field="vocab_size",
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[eos_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    # Written by hand rather than by transformers' save_pretrained: its output
    # changed between major versions (5.x names a class 4.x cannot load).
    special = {"eos_token": eos_token, "pad_token": eos_token}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        **special,
    }
    (out / "tokenizer_config.json").write_bytes(orjson.dumps(config, option=orjson.OPT_INDENT_2) + b"\n")
    (out / "special_tokens_map.json").write_bytes(orjson.dumps(special, option=orjson.OPT_INDENT_2) + b"\n")
    return out
