"""Fingerprints and the resume-state check every positioned dataset shares (DESIGN contract 3)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tokenloom.formats import ResumeMismatchError, TokenDataset

__all__ = ["check_state", "data_fingerprint", "settings_fingerprint"]


def settings_fingerprint(**settings: Any) -> str:
    """A short stable hash of JSON-able settings (keys sorted)."""
    blob = json.dumps(settings, sort_keys=True, default=str).encode()
    return hashlib.blake2b(blob, digest_size=12).hexdigest()


def data_fingerprint(dataset: TokenDataset) -> str:
    """The manifest fingerprint, or (formats without one) a hash of shard names, sizes and entry counts."""
    if dataset.fingerprint:
        return dataset.fingerprint
    shards = [(s.tokens_path.name, s.tokens_offset, s.num_tokens, s.num_entries) for s in dataset.shards]
    return settings_fingerprint(format=dataset.format, shards=shards, dtype=dataset.dtype.name)


def check_state(state: Any, *, fingerprint: str, owner: str) -> dict[str, Any]:
    """``state`` as a dict whose fingerprint matches, or ResumeMismatchError."""
    if not isinstance(state, dict) or "fingerprint" not in state:
        raise ResumeMismatchError(f"{owner} state {state!r} has no fingerprint", field="fingerprint")
    if state["fingerprint"] != fingerprint:
        raise ResumeMismatchError(
            f"{owner} state was saved for fingerprint {state['fingerprint']!r}, this one is {fingerprint!r}",
            field="fingerprint",
        )
    return state
