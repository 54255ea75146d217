"""What ``--windowing gpt-simple`` needs beyond the rule itself to give GPT-Simple's bytes.

GPT-Simple's pretokenize (gpt-simple-lm 0.1.2) also decides which input files
it reads (``INPUT/*.jsonl`` and ``*.jsonl.gz``, not recursive), the token dtype
(uint16 iff its tokenizer wrapper's ``len(tokenizer)`` is below 65,536, after
it has added a ``<|pad|>`` token when the tokenizer has none), and the EOD id
(for a directory holding ``tokenizer.json`` its wrapper builds a
``GPT2TokenizerFast`` from that file alone, whose EOS is ``<|endoftext|>``,
whatever ``tokenizer_config.json`` says). Where tokenloom cannot follow it
exactly, it refuses with a ConfigError instead of writing other bytes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tokenloom.formats import ConfigError
from tokenloom.tokenize._inputs import InputFile

__all__ = ["GPT_SIMPLE_EOD_TOKEN", "check_gpt_simple_eod", "check_gpt_simple_inputs", "gpt_simple_dtype"]

GPT_SIMPLE_EOD_TOKEN = "<|endoftext|>"


def check_gpt_simple_inputs(files: list[InputFile]) -> None:
    """GPT-Simple reads only the top level of its input directory: refuse inputs in subdirectories."""
    nested = [f.relative for f in files if "/" in f.relative]
    if nested:
        shown = ", ".join(nested[:3]) + (f" and {len(nested) - 3} more" if len(nested) > 3 else "")
        raise ConfigError(
            f"{len(nested)} input file(s) lie in subdirectories ({shown}); GPT-Simple's pretokenize reads only "
            "INPUT/*.jsonl and INPUT/*.jsonl.gz, so --windowing gpt-simple would not reproduce its output",
            field="input_dir",
            hint="Point --input-dir at the directory GPT-Simple read, or use --windowing tokenloom",
        )


def gpt_simple_dtype(vocab_size: int) -> np.dtype:
    """GPT-Simple's token dtype for a tokenizer of ``vocab_size`` ids (added tokens included)."""
    if vocab_size < 65535:
        return np.dtype(np.uint16)
    if vocab_size > 65535:
        return np.dtype(np.uint32)
    raise ConfigError(
        "the tokenizer has 65,535 ids: GPT-Simple writes uint32 if its tokenizer wrapper adds a <|pad|> token "
        "(it does when the tokenizer has no pad token and no '<|pad|>' in its vocabulary), uint16 otherwise, "
        "and tokenloom cannot tell which it did",
        field="windowing",
        hint="Run GPT-Simple's pretokenize and open its output with tokenloom, or use --windowing tokenloom",
    )


def check_gpt_simple_eod(tokenizer: str, eod_id: int, eos_id_given: bool) -> None:
    """Refuse an EOD id other than the one GPT-Simple's wrapper uses for a tokenizer.json directory."""
    directory = Path(tokenizer)
    if not (directory / "tokenizer.json").is_file() or any(directory.glob("*.model")):
        return  # GPT-Simple loads other tokenizers through transformers: its EOS is the tokenizer's own
    from tokenizers import Tokenizer

    expected = Tokenizer.from_file(str(directory / "tokenizer.json")).token_to_id(GPT_SIMPLE_EOD_TOKEN)
    if expected is None:
        raise ConfigError(
            f"the tokenizer has no {GPT_SIMPLE_EOD_TOKEN} token: GPT-Simple's wrapper loads a tokenizer.json "
            f"directory as GPT2TokenizerFast, whose end-of-document token is {GPT_SIMPLE_EOD_TOKEN}, "
            "so GPT-Simple's pretokenize cannot run with it and there is no output to reproduce",
            path=directory,
            field="windowing",
            hint="Use --windowing tokenloom",
        )
    if eod_id != expected:
        how = "--eos-id" if eos_id_given else "the tokenizer's EOS"
        raise ConfigError(
            f"the end-of-document id is {eod_id} ({how}), but GPT-Simple ends documents with "
            f"{GPT_SIMPLE_EOD_TOKEN} = {expected} for a tokenizer.json directory",
            path=directory,
            field="eos_id",
            hint=f"Pass --eos-id {expected} to reproduce GPT-Simple's output, or use --windowing tokenloom",
        )
