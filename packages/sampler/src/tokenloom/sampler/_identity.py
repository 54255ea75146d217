"""Which dataset a sampler state belongs to, and the largest epoch that makes sense.

The sampler's own identity (n, seed, order, ...) cannot tell two datasets of the
same length apart; the dataset's fingerprint can. It is recorded in the state
when the dataset has one (``ds.fingerprint`` attribute or ``ds.fingerprint()``),
and a state that records another is refused. A state without one (saved from a
plain length, or by an earlier version) is accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenloom.formats.errors import ConfigError, ResumeMismatchError
from tokenloom.sampler._config import check_int

__all__ = ["DATA_FINGERPRINT_KEY", "MAX_EPOCH", "check_data_fingerprint", "check_epoch", "data_fingerprint"]

#: Epochs are counters keyed into the order; more than 2**32 - 1 is a bug (e.g. a step count passed as epoch).
MAX_EPOCH = 2**32 - 1
DATA_FINGERPRINT_KEY = "data_fingerprint"


def data_fingerprint(dataset: object) -> str | None:
    """The dataset's fingerprint, when it has one."""
    value: Any = getattr(dataset, "fingerprint", None)
    if callable(value):
        try:
            value = value()
        except Exception:  # a dataset whose fingerprint needs more than we have: treat as unknown
            return None
    return value if isinstance(value, str) and value else None


def check_data_fingerprint(state: Mapping[str, Any], ours: str | None) -> None:
    """ResumeMismatchError when ``state`` records another dataset's fingerprint than ``ours``."""
    saved = state.get(DATA_FINGERPRINT_KEY)
    if saved is None or ours is None or saved == ours:
        return
    raise ResumeMismatchError(
        f"the state belongs to another dataset of the same length: dataset fingerprint saved {saved!r}, "
        f"this dataset {ours!r}",
        field=DATA_FINGERPRINT_KEY,
        hint="Build the sampler over the dataset the state was saved from, or start afresh",
    )


def check_epoch(name: str, value: object) -> int:
    """``value`` as an epoch: an integer >= 0 and at most MAX_EPOCH."""
    epoch = check_int(name, value, 0)
    if epoch > MAX_EPOCH:
        raise ConfigError(
            f"{name} is {epoch}, more than {MAX_EPOCH:,}",
            field=name,
            hint="An epoch counts passes over the data; was a step or sample count passed as the epoch?",
        )
    return epoch
