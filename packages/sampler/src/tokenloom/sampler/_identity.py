"""Which dataset a sampler state belongs to, and the largest epoch that makes sense.

The sampler's own identity (n, seed, order, ...) cannot tell two datasets of the
same length apart; the dataset's fingerprint can. It is recorded in the state
when the dataset has one (``ds.fingerprint`` attribute or ``ds.fingerprint()``),
and a state that records another is refused. A sampler over a dataset with a
fingerprint also refuses a state that records none (the key absent or null): such a
state was saved from a plain length, by a version before the key existed (#11), or
had the key removed, and nothing then says it belongs to this dataset. The caller
opts out explicitly with ``allow_missing_data_fingerprint=True``. A sampler over a
plain length (no fingerprint of its own) has nothing to compare and accepts any state.

Data in object storage also records each object's identity (``data_objects``: ``{URL: "size:ETag"}``,
from the dataset's ``data_objects()``), so a refusal names the object that changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenloom.formats.errors import ConfigError, ResumeMismatchError
from tokenloom.sampler._config import check_int

__all__ = [
    "DATA_FINGERPRINT_KEY",
    "DATA_OBJECTS_KEY",
    "MAX_EPOCH",
    "check_data_fingerprint",
    "check_epoch",
    "check_objects",
    "data_fingerprint",
    "data_objects",
]

#: Epochs are counters keyed into the order; more than 2**32 - 1 is a bug (e.g. a step count passed as epoch).
MAX_EPOCH = 2**32 - 1
DATA_FINGERPRINT_KEY = "data_fingerprint"
DATA_OBJECTS_KEY = "data_objects"


def data_fingerprint(dataset: object) -> str | None:
    """The dataset's fingerprint, when it has one."""
    value: Any = getattr(dataset, "fingerprint", None)
    if callable(value):
        try:
            value = value()
        except Exception:  # a dataset whose fingerprint needs more than we have: treat as unknown
            return None
    return value if isinstance(value, str) and value else None


def data_objects(*datasets: object) -> dict[str, str]:
    """``{URL: "size:ETag"}`` of the datasets' objects in storage, merged and sorted ({} for local data or a
    plain length)."""
    objects: dict[str, str] = {}
    for dataset in datasets:
        method = getattr(dataset, "data_objects", None)
        found = method() if callable(method) else None
        if isinstance(found, Mapping):
            objects.update((str(k), str(v)) for k, v in found.items())
    return dict(sorted(objects.items()))


def check_objects(saved: object, ours: Mapping[str, str], *, what: str = "", field: str) -> None:
    """ResumeMismatchError naming the objects in storage that differ between a state's ``data_objects`` (``saved``)
    and ``ours``; ``what`` leads the message (whose state it is). Nothing when none differs or none is known."""
    if not isinstance(saved, Mapping) or not ours:
        return
    changed = []
    for url in sorted(set(saved) | set(ours)):
        before, now = saved.get(url), ours.get(url)
        if before != now:
            changed.append(f"{url} {'changed' if before and now else 'appeared' if now else 'is gone'} "
                           f"(saved size:ETag {before}, now {now})")  # fmt: skip
    if changed:
        shown = "; ".join(changed[:5]) + (f"; and {len(changed) - 5} more" if len(changed) > 5 else "")
        raise ResumeMismatchError(
            f"{what}object(s) in storage changed between save and resume: {shown}",
            path=changed[0].split(" ", 1)[0],
            field=field,
            hint="Restore the objects the run was started on, or start afresh (the saved position would "
            "address other samples)",
        )


def check_data_fingerprint(
    state: Mapping[str, Any],
    ours: str | None,
    *,
    allow_missing: bool = False,
    objects: Mapping[str, str] | None = None,
) -> None:
    """ResumeMismatchError when ``state`` records another dataset's fingerprint than ``ours``, or none.

    ``allow_missing``: accept a state that records no fingerprint (absent or null) although
    ``ours`` is known (states saved from a plain length or before the key existed).
    """
    saved = state.get(DATA_FINGERPRINT_KEY)
    if ours is None or saved == ours:
        return
    if saved is None:
        if allow_missing:
            return
        how = "has data_fingerprint=null" if DATA_FINGERPRINT_KEY in state else "has no data_fingerprint"
        raise ResumeMismatchError(
            f"the sampler state {how}, so nothing says it was saved from this dataset (fingerprint {ours!r}); "
            "a state saved from a plain length, by a version before data fingerprints, or with the key "
            "removed could belong to any dataset of the same length",
            field=DATA_FINGERPRINT_KEY,
            hint="If the state is known to come from this dataset, build the sampler with "
            "ResumableDistributedSampler(..., allow_missing_data_fingerprint=True); otherwise start afresh",
        )
    if not isinstance(saved, str):
        raise ResumeMismatchError(
            f"the sampler state's data_fingerprint is {type(saved).__name__} {saved!r}, expected a string",
            field=DATA_FINGERPRINT_KEY,
            hint="Pass a state from ResumableDistributedSampler.state_dict(), unedited",
        )
    check_objects(state.get(DATA_OBJECTS_KEY), objects or {}, field=DATA_FINGERPRINT_KEY)
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
