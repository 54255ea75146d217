"""Build the demo corpus: the standard library's docstrings as jsonl.

    uv run python tools/corpus/build_demo_corpus.py OUT_DIR [--min-chars 200]

Writes OUT_DIR/stdlib-docs.jsonl ({"id": ..., "text": ...} per module, class,
function or method with a docstring of at least --min-chars characters), sorted
and identical across runs on the same Python. The code lives in
tokenloom.tokenize.corpus so that `tokenloom demo` can use it installed.
"""

from __future__ import annotations

import argparse

from tokenloom.tokenize import build_stdlib_corpus


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--min-chars", type=int, default=200)
    args = parser.parse_args()
    info = build_stdlib_corpus(args.out_dir, min_chars=args.min_chars)
    print(f"{info.path}: {info.documents} documents, {info.num_bytes:,} bytes, sha256 {info.sha256}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
