"""The sampler's resume state: plain JSON, checked field by field on load.

Why a fingerprint as well as the fields: the fields say *what* the order was
made from; the fingerprint also covers the algorithm version, so a state saved
by a future, different permutation is refused instead of silently reordering.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenloom.formats.errors import ResumeMismatchError

__all__ = ["FORMAT", "SamplerIdentity", "check_state", "make_state"]

FORMAT = "tokenloom.sampler/1"
_ALGORITHM = "feistel6-fmix64-splitmix64/1"
_IDENTITY_FIELDS = ("n", "seed", "order", "shuffle", "drop_last", "pad")
_BLOCK_FIELDS = ("block_samples", "window_blocks")
_TYPES: dict[str, type | tuple[type, ...]] = {
    "format": str,
    "epoch": int,
    "consumed": int,
    "n": int,
    "seed": int,
    "order": str,
    "shuffle": bool,
    "drop_last": bool,
    "pad": bool,
    "fingerprint": str,
}


@dataclass(frozen=True, slots=True)
class SamplerIdentity:
    """Everything that decides which index comes at which position, and the tail."""

    n: int
    seed: int
    order: str
    shuffle: bool
    drop_last: bool
    pad: bool
    block_samples: int = 0
    """order="block" only (0 otherwise, and then absent from states)."""
    window_blocks: int = 0

    @property
    def fields(self) -> tuple[str, ...]:
        return _IDENTITY_FIELDS + (_BLOCK_FIELDS if self.order == "block" else ())

    def as_dict(self) -> dict[str, Any]:
        return {field: getattr(self, field) for field in self.fields}

    def fingerprint(self) -> str:
        payload = json.dumps({"algorithm": _ALGORITHM, **self.as_dict()}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def make_state(identity: SamplerIdentity, *, epoch: int, consumed: int) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "epoch": epoch,
        "consumed": consumed,
        **identity.as_dict(),
        "fingerprint": identity.fingerprint(),
    }


def _is(value: object, kind: type | tuple[type, ...]) -> bool:
    if kind is int and isinstance(value, bool):
        return False
    return isinstance(value, kind)


def check_state(state: object, identity: SamplerIdentity) -> tuple[int, int]:
    """Validate ``state`` against this sampler; return (epoch, consumed) or raise."""
    if not isinstance(state, Mapping):
        raise ResumeMismatchError(f"a sampler state must be a dict, got {type(state).__name__}", field="state")
    missing = [key for key in _TYPES if key not in state]
    if missing:
        raise ResumeMismatchError(
            f"sampler state lacks {', '.join(missing)}; expected a dict from ResumableDistributedSampler.state_dict()",
            field=missing[0],
        )
    wrong = [f"{key}={state[key]!r}" for key, kind in _TYPES.items() if not _is(state[key], kind)]
    if wrong:
        raise ResumeMismatchError(f"sampler state has values of the wrong type: {', '.join(wrong)}")
    if state["format"] != FORMAT:
        raise ResumeMismatchError(f"sampler state format is {state['format']!r}, expected {FORMAT!r}", field="format")
    ours = identity.as_dict()
    saved_fields = _IDENTITY_FIELDS + (_BLOCK_FIELDS if state["order"] == "block" else ())
    bad = [f"{key}={state.get(key)!r}" for key in saved_fields[len(_IDENTITY_FIELDS) :] if not _is(state.get(key), int)]
    if bad:
        raise ResumeMismatchError(
            f"sampler state of order 'block' lacks or mistypes {', '.join(bad)}",
            field="order",
            hint="Pass a state from ResumableDistributedSampler.state_dict(), unedited",
        )
    differences = [
        f"{field}: saved {state.get(field)!r}, this sampler {ours.get(field)!r}"
        for field in dict.fromkeys(saved_fields + identity.fields)
        if state.get(field) != ours.get(field)
    ]
    expected = SamplerIdentity(**{field: state[field] for field in saved_fields}).fingerprint()
    if state["fingerprint"] != expected:
        differences.append(
            f"fingerprint: saved {state['fingerprint']!r}, but the saved fields give {expected!r} "
            "(another algorithm version, or an edited state)"
        )
    if differences:
        raise ResumeMismatchError(
            "the state belongs to another sampler; differing fields: " + "; ".join(differences),
            hint="Build the sampler with the saved n, seed, order, shuffle, drop_last and pad, or start afresh",
        )
    epoch, consumed = state["epoch"], state["consumed"]
    if epoch < 0 or not 0 <= consumed <= identity.n:
        raise ResumeMismatchError(
            f"sampler state has epoch={epoch}, consumed={consumed}; "
            f"expected epoch >= 0 and consumed in [0, {identity.n}]"
        )
    return epoch, consumed
