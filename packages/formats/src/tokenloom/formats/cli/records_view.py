"""``tokenloom inspect OUT --records N``: a record store's first records, trained spans highlighted.

People check masks by eye before they spend a GPU week: each record's token keys are shown as text
(decoded with the tokenizer the store was written with, or ``--tokenizer DIR``; token ids without
one), trained runs highlighted (on a terminal) or wrapped in ⟦ ⟧ (elsewhere), with each record's
mask share; the store's settings and counts (records, truncated, skipped) come from the
``post_training.json`` written beside it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson

from tokenloom.formats.errors import ConfigError, DataError
from tokenloom.formats.keyed.records import POST_TRAINING_SIDECAR, RecordStore, open_records

__all__ = ["record_facts", "show_records"]

#: (tokens key, mask key) pairs a store may hold, in display order
_PAIRS = (("sequence", "loss_mask"), ("chosen", "chosen_mask"), ("rejected", "rejected_mask"), ("responses", "masks"))
_OPEN, _CLOSE = "\u27e6", "\u27e7"


def _sidecar(root: Path) -> dict[str, Any]:
    path = root / POST_TRAINING_SIDECAR
    if not path.is_file():
        return {}
    try:
        value = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise DataError(f"{POST_TRAINING_SIDECAR} is not valid JSON ({exc})", path=path) from None
    return value if isinstance(value, dict) else {}


def _decoder(tokenizer: str | None, *, given: bool = False) -> Any:
    """A ``tokenizers.Tokenizer`` for ``tokenizer`` (a directory or tokenizer.json), or None.

    ``given``: the user named it (--tokenizer), so one that cannot be read is a ConfigError; the one the
    store recorded may be gone or broken on this machine, and the records show as token ids.
    """
    if not tokenizer:
        return None
    path = Path(tokenizer)
    path = path / "tokenizer.json" if path.is_dir() else path
    if not path.is_file():
        if given:
            raise ConfigError(f"--tokenizer {tokenizer}: no tokenizer.json there", path=path, field="tokenizer")
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        if given:  # the user asked for text: say what is missing instead of showing ids
            raise ConfigError(
                f"--tokenizer {tokenizer}: decoding needs the tokenizers package, which is not installed",
                path=path,
                field="tokenizer",
                hint="pip install tokenizers (it comes with tokenloom-tokenize), or leave --tokenizer out to see ids",
            ) from None
        return None
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises plain Exception for a file it cannot parse
        if given:
            raise ConfigError(f"cannot read the tokenizer ({exc})", path=path, field="tokenizer") from None
        return None


def _pieces(tokens: np.ndarray, mask: np.ndarray, decoder: Any) -> list[tuple[str, bool]]:
    """(text, trained) for each run of equal mask values."""
    flags = np.asarray(mask) != 0
    edges = np.flatnonzero(np.diff(flags.astype(np.int8))) + 1
    out = []
    for begin, end in zip([0, *edges.tolist()], [*edges.tolist(), len(flags)], strict=True):
        if begin == end:
            continue
        ids = [int(i) for i in tokens[begin:end]]
        text = decoder.decode(ids, skip_special_tokens=False) if decoder is not None else " ".join(map(str, ids))
        out.append((text, bool(flags[begin])))
    return out


def _sides(record: dict[str, Any]) -> list[tuple[str, np.ndarray, np.ndarray]]:
    sides = []
    for tokens_key, mask_key in _PAIRS:
        if tokens_key not in record or mask_key not in record:
            continue
        tokens, mask = record[tokens_key], record[mask_key]
        if isinstance(tokens, list):
            prompt = record.get("prompts")
            for j, (response, response_mask) in enumerate(zip(tokens, mask, strict=True)):
                if prompt is not None and j == 0:
                    sides.append(("prompts", np.asarray(prompt), np.zeros(len(prompt), dtype=bool)))
                sides.append((f"responses[{j}]", np.asarray(response), np.asarray(response_mask)))
        else:
            sides.append((tokens_key, np.asarray(tokens), np.asarray(mask)))
    return sides


def record_facts(path: Path, count: int, tokenizer: str | None = None) -> dict[str, Any]:
    """The first ``count`` records as (key, pieces, trained, tokens), plus the store's recorded settings."""
    store: RecordStore = open_records(path)
    sidecar = _sidecar(Path(path))
    decoder = _decoder(tokenizer, given=True) if tokenizer else _decoder(sidecar.get("tokenizer"))
    records = []
    for index in range(min(count, len(store))):
        sides = []
        for key, tokens, mask in _sides(store.record(index)):
            sides.append(
                {
                    "key": key,
                    "tokens": len(tokens),
                    "trained": int((mask != 0).sum()),
                    "pieces": _pieces(tokens, mask, decoder),
                }
            )
        if not sides:
            raise ConfigError(
                f"record store keys {store.keys} hold no tokens-and-mask pair", path=path, field="records"
            )
        records.append({"index": index, "sides": sides})
    return {
        "path": str(path),
        "records": len(store),
        "keys": store.keys,
        "decoded": decoder is not None,
        "settings": {k: v for k, v in sidecar.items() if k not in ("stats", "tokenloom_post_training")},
        "stats": sidecar.get("stats") if isinstance(sidecar.get("stats"), dict) else None,
        "shown": records,
    }


def show_records(facts: dict[str, Any]) -> None:
    """Print ``record_facts`` with rich (styles on a terminal, ⟦ ⟧ around trained text elsewhere)."""
    from rich.console import Console
    from rich.text import Text

    console = Console(highlight=False, soft_wrap=True)
    plain = not console.is_terminal
    console.print(f"{facts['path']}: {facts['records']:,} records, keys {', '.join(facts['keys'])}")
    stats = facts.get("stats") or {}
    if stats:
        share = stats.get("trained_tokens", 0) / stats["tokens"] if stats.get("tokens") else 0.0
        console.print(
            f"written {stats.get('records', 0):,}  truncated {stats.get('truncated', 0):,}  "
            f"skipped (too long) {stats.get('skipped_too_long', 0):,}  skipped (errors) "
            f"{stats.get('skipped_errors', 0):,} {stats.get('errors') or ''}  mask share {share:.1%}"
        )
    settings = facts.get("settings") or {}
    if settings:
        console.print("settings   " + "  ".join(f"{k} {v}" for k, v in settings.items() if k != "chat_template_sha256"))
    legend = f"trained text in {_OPEN} {_CLOSE}" if plain else "trained text highlighted"
    console.print(f"{legend}; {'decoded' if facts['decoded'] else 'token ids (no tokenizer: pass --tokenizer DIR)'}")
    for record in facts["shown"]:
        for side in record["sides"]:
            share = side["trained"] / side["tokens"] if side["tokens"] else 0.0
            console.print(
                f"\n── record {record['index']} · {side['key']} · {side['tokens']} tokens · mask share {share:.1%}",
                style="bold",
            )
            text = Text()
            for number, (piece, trained) in enumerate(side["pieces"]):
                if number and not facts["decoded"]:
                    text.append(" ")
                if plain and trained:
                    text.append(f"{_OPEN}{piece}{_CLOSE}")
                else:
                    text.append(piece, style="bold black on green" if trained else "dim")
            console.print(text)
