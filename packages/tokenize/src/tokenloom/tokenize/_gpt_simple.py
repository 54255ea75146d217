"""What ``--windowing gpt-simple`` needs beyond the rule itself to give GPT-Simple's bytes.

GPT-Simple's pretokenize (gpt-simple-lm 0.1.2) also decides which input files
it reads (``INPUT/*.jsonl`` and ``*.jsonl.gz``, not recursive), the token dtype
(uint16 iff its tokenizer wrapper's ``len(tokenizer)`` is below 65,536, after
it has added a ``<|pad|>`` token when the tokenizer has none), and the EOD id
(for a directory holding ``tokenizer.json`` its wrapper builds a
``GPT2TokenizerFast`` from that file alone, whose EOS is ``<|endoftext|>``,
whatever ``tokenizer_config.json`` says), and how it reads a line: text mode
(a bare ``\r`` ends a line), ``line.strip()`` (Unicode whitespace), blank lines
skipped, ``json.loads`` (NaN and Infinity accepted), a record without ``text``
skipped. Where tokenloom cannot follow it exactly, it refuses with a
ConfigError or RecordError instead of writing other bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from tokenloom.formats import ConfigError, RecordError
from tokenloom.tokenize.inputs import InputFile, Issue, IssueKind, invalid_utf8

__all__ = [
    "BLANK_LINE",
    "GPT_SIMPLE_EOD_TOKEN",
    "GPT_SIMPLE_PAD_TOKEN",
    "NO_TEXT_FIELD",
    "Dropped",
    "check_gpt_simple_eod",
    "check_gpt_simple_inputs",
    "check_gpt_simple_pad",
    "gpt_simple_dtype",
    "gpt_simple_pad_is_added",
    "gpt_simple_text_of",
    "output_stem",
]

GPT_SIMPLE_EOD_TOKEN = "<|endoftext|>"
GPT_SIMPLE_PAD_TOKEN = "<|pad|>"
BLANK_LINE = "blank_line"
"""Dropped kind: a line that is empty after ``str.strip()`` (GPT-Simple skips it)."""
NO_TEXT_FIELD = "no_text_field"
"""Dropped kind: a JSON object without the text field (GPT-Simple reads it as ``""`` and skips it)."""


def output_stem(name: str) -> str:
    """GPT-Simple's output name for an input file: ``a.jsonl.gz`` and ``a.jsonl`` both give ``a``."""
    for suffix in (".gz", ".jsonl"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def _shown(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def check_gpt_simple_inputs(files: list[InputFile]) -> None:
    """GPT-Simple reads only the top level of its input directory: refuse inputs in subdirectories."""
    other = [f.relative for f in files if not f.relative.endswith((".jsonl", ".jsonl.gz"))]
    if other:
        raise ConfigError(
            f"{len(other)} input file(s) are not .jsonl or .jsonl.gz ({_shown(other)}); GPT-Simple's pretokenize reads "
            "only those, so --windowing gpt-simple would not reproduce its output",
            field="input_dir",
            hint="Use --windowing tokenloom for zstd, .json.gz, parquet and Arrow inputs",
        )
    nested = [f.relative for f in files if "/" in f.relative]
    if nested:
        raise ConfigError(
            f"{len(nested)} input file(s) lie in subdirectories ({_shown(nested)}); GPT-Simple's pretokenize reads "
            "only INPUT/*.jsonl and INPUT/*.jsonl.gz, so --windowing gpt-simple would not reproduce its output",
            field="input_dir",
            hint="Point --input-dir at the directory GPT-Simple read, or use --windowing tokenloom",
        )
    by_stem: dict[str, list[str]] = {}
    for f in files:
        by_stem.setdefault(output_stem(f.relative), []).append(f.relative)
    collisions = [names for names in by_stem.values() if len(names) > 1]
    if collisions:
        shown = "; ".join(" and ".join(names) for names in collisions[:3])
        stem = output_stem(collisions[0][0])
        raise ConfigError(
            f"input files {shown} would share one output: GPT-Simple's pretokenize writes each of them to "
            f"{stem}.bin/{stem}.idx, so one overwrites the other and --windowing gpt-simple cannot reproduce "
            "its output",
            field="input_dir",
            hint="Keep one file of each name (a.jsonl or a.jsonl.gz) in the input directory, "
            "or use --windowing tokenloom",
        )


def gpt_simple_pad_is_added(tokenizer: str) -> bool:
    """Whether the tokenizer (a tokenizer.json directory) already has ``<|pad|>`` as an added token.

    GPT-Simple's wrapper adds ``<|pad|>`` as a special token when its tokenizer has no pad token, so a
    document holding that text gets one token there. Only a tokenizer.json directory is known to agree
    (its added tokens are what GPT-Simple's GPT2TokenizerFast reads); any other tokenizer counts as not.
    """
    path = Path(tokenizer) / "tokenizer.json"
    if not path.is_file():
        return False
    try:
        added = orjson.loads(path.read_bytes()).get("added_tokens") or []
    except (orjson.JSONDecodeError, AttributeError, OSError):
        return False
    return any(isinstance(token, dict) and token.get("content") == GPT_SIMPLE_PAD_TOKEN for token in added)


def check_gpt_simple_pad(texts: list[str], text_lines: list[int] | range, path: str) -> None:
    """Refuse a document holding ``<|pad|>`` literally: GPT-Simple encodes it as its added pad token."""
    for index, text in enumerate(texts):
        if GPT_SIMPLE_PAD_TOKEN in text:
            raise RecordError(
                f"the document holds the text {GPT_SIMPLE_PAD_TOKEN!r}: GPT-Simple's tokenizer wrapper adds "
                f"{GPT_SIMPLE_PAD_TOKEN} as a special token, so its pretokenize writes that text as one new id "
                "(the vocabulary size), which this tokenizer does not have; --windowing gpt-simple cannot "
                "reproduce it",
                path=path,
                record=text_lines[index],
                field="windowing",
                hint=f"Remove or escape {GPT_SIMPLE_PAD_TOKEN} in that document, or use --windowing tokenloom",
            )


@dataclass(frozen=True, slots=True)
class Dropped:
    """A line GPT-Simple skips without a word (a blank line, a record without the text field); counted here."""

    kind: str


def gpt_simple_text_of(line: bytes, text_field: tuple[str, ...], line_number: int, path: str) -> str | Issue | Dropped:
    """One line (without its ``\\n`` or ``\\r\\n``) read as GPT-Simple reads it.

    The text, a :class:`Dropped` (GPT-Simple skips the line), or an :class:`Issue` (the line is bad:
    JSON that ``json.loads`` rejects too, which GPT-Simple skips, or a record GPT-Simple cannot read).
    Raises RecordError for a bare ``\\r`` inside the line: GPT-Simple's text mode ends a line there.
    """
    if b"\r" in line.strip():
        raise RecordError(
            "the line holds a bare carriage return (\\r, not part of a \\r\\n line ending): GPT-Simple reads "
            "its input in text mode, where a bare \\r ends a line, so it reads this line as two; "
            "--windowing gpt-simple cannot reproduce that",
            path=path,
            record=line_number,
            field="windowing",
            hint="Replace the bare \\r with \\n (or remove it) in the input, or use --windowing tokenloom",
        )
    fallback = False
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        fallback = True
        try:
            decoded = line.decode("utf-8")
        except UnicodeDecodeError as utf8_exc:
            return invalid_utf8(line_number, utf8_exc)
        stripped = decoded.strip()  # as GPT-Simple: Unicode whitespace (form feed, no-break space, ...) too
        if not stripped:
            return Dropped(BLANK_LINE)
        try:
            record = json.loads(stripped)  # as GPT-Simple: NaN, Infinity and -Infinity accepted
        except ValueError as exc:
            return Issue(
                line_number,
                IssueKind.MALFORMED_JSON,
                f"the line is not valid JSON ({exc}); GPT-Simple skips such a line without counting it",
            )
    if not isinstance(record, dict):
        return Issue(
            line_number,
            IssueKind.NOT_AN_OBJECT,
            f"the line is a JSON {type(record).__name__}, expected an object (GPT-Simple's pretokenize fails on it)",
        )
    value: object = record
    for key in text_field:
        if not isinstance(value, dict) or key not in value:
            return Dropped(NO_TEXT_FIELD)
        value = value[key]
    if not isinstance(value, str):
        return Issue(
            line_number,
            IssueKind.NON_STRING_FIELD,
            f"field {'.'.join(text_field)!r} is a JSON {type(value).__name__}, expected a string "
            "(GPT-Simple's pretokenize fails on it)",
        )
    if fallback:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:  # json.loads accepts a lone surrogate escape such as \ud800
            return Issue(
                line_number,
                IssueKind.MALFORMED_JSON,
                f"field {'.'.join(text_field)!r} holds a lone UTF-16 surrogate escape (character {exc.start}), "
                "which no tokenizer can encode (GPT-Simple's pretokenize fails on it)",
            )
    return value


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
