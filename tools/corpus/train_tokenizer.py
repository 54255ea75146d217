"""Train the shipped byte-level BPE on the demo corpus.

    uv run python tools/corpus/train_tokenizer.py [--out DIR] [--vocab-size 16384]

Builds the stdlib docstring corpus in a temporary directory, trains a byte-level
BPE with `<|endoftext|>` as EOS (and pad) and writes a Hugging Face tokenizer
directory (tokenizer.json, tokenizer_config.json, special_tokens_map.json),
by default into the tokenize package's assets, where `--tokenizer` finds it.
min_frequency is 1 because the corpus (about 1.3 MB) is too small to reach
16k merges that each occur twice.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import orjson

from tokenloom.tokenize import build_stdlib_corpus, default_tokenizer_path, fingerprint, train_byte_level_bpe


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=default_tokenizer_path())
    parser.add_argument("--vocab-size", type=int, default=16384)
    parser.add_argument("--min-frequency", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        corpus = build_stdlib_corpus(tmp)
        texts = [orjson.loads(line)["text"] for line in corpus.path.read_bytes().splitlines()]
    out = train_byte_level_bpe(texts, args.out, vocab_size=args.vocab_size, min_frequency=args.min_frequency)
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"{out}: {size:,} bytes, corpus sha256 {corpus.sha256}, tokenizer {fingerprint(str(out))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
