"""Plain jsonl: one JSON object per line; the kind of every file without another kind's magic bytes."""

from __future__ import annotations

from typing import Any

from tokenloom.tokenize.inputs._registry import Cut, InputReader, register

__all__ = ["JSONL"]


class _Jsonl(InputReader):
    name = "jsonl"
    suffixes = (".jsonl",)
    cut = Cut.BYTES

    def open(self, source: Any, **options: Any) -> Any:
        return source


JSONL = register(_Jsonl())
