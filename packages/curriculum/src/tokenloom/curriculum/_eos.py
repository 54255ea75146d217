"""The EOS id of a curriculum's data when its shards declare none (GPT-Simple's own output has no manifest).

GPT-Simple takes the EOS id from its tokenizer (the data block's ``tokenizer``: a name or a local path); a
curriculum config may state it as ``eos_id`` too. Here: ``eos_id`` if given, else the id a local tokenizer
directory declares (``tokenizer_config.json``'s ``eos_token`` looked up in ``tokenizer.json``; plain JSON, no
tokenizer library), else None. A hub name (``gpt2``) cannot be read offline: then ``eos_id`` is the way.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tokenloom.formats import ConfigError

__all__ = ["config_eos_id", "tokenizer_eos_id"]


def config_eos_id(eos_id: Any, tokenizer: str | None, where: str | None) -> int | None:
    """The EOS id a curriculum config gives (``eos_id``, else its local ``tokenizer``'s), validated, or None."""
    if eos_id is not None:
        if isinstance(eos_id, bool) or not isinstance(eos_id, int) or eos_id < 0:
            raise ConfigError(
                f"eos_id is {eos_id!r}, expected a token id (an int >= 0)",
                path=where,
                field="eos_id",
                hint="Write the tokenizer's end-of-document id, e.g. eos_id: 50256 for GPT-2",
            )
        return int(eos_id)
    return tokenizer_eos_id(tokenizer) if tokenizer else None


def tokenizer_eos_id(tokenizer: str | os.PathLike[str]) -> int | None:
    """The EOS id a local tokenizer directory (or its ``tokenizer.json``) declares; None if it cannot be told."""
    path = Path(tokenizer)
    folder = path.parent if path.is_file() else path
    if not folder.is_dir():
        return None  # a hub name: not readable offline
    config = _json(folder / "tokenizer_config.json")
    token = config.get("eos_token") if isinstance(config, dict) else None
    if isinstance(token, dict):
        token = token.get("content")
    if not isinstance(token, str):
        return None
    table = _json(path if path.is_file() else folder / "tokenizer.json")
    if not isinstance(table, dict):
        return None
    for added in table.get("added_tokens") or ():
        if isinstance(added, dict) and added.get("content") == token and isinstance(added.get("id"), int):
            return int(added["id"])
    vocab = (table.get("model") or {}).get("vocab")
    found = vocab.get(token) if isinstance(vocab, dict) else None
    return int(found) if isinstance(found, int) else None


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
