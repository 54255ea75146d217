"""Take the sampler's state out of a torchdata StatefulDataLoader state.

Why: with workers, a DataLoader draws indices ahead of what it has yielded, so
``sampler.state_dict()`` runs ahead of training. StatefulDataLoader keeps, per
yielded batch, the sampler state as it was when that batch was drawn; that is
the state to resume from. Its own ``load_state_dict`` only accepts the same
``num_workers``, so to resume with another worker count (or world size) load
this extracted state into the sampler and give it to a fresh loader.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenloom.formats.errors import ConfigError
from tokenloom.sampler._state import FORMAT

__all__ = ["sampler_state_from_loader"]

_SNAPSHOT = "_snapshot"
_STEPS_SINCE_SNAPSHOT = "_steps_since_snapshot"
_MAIN_SNAPSHOT = "_main_snapshot"


def _find_states(node: object, found: list[dict[str, Any]]) -> None:
    if isinstance(node, Mapping):
        if node.get("format") == FORMAT:
            found.append(dict(node))
            return
        for value in node.values():
            _find_states(value, found)
    elif isinstance(node, list | tuple):
        for value in node:
            _find_states(value, found)


def sampler_state_from_loader(loader_state: Mapping[str, Any]) -> dict[str, Any]:
    """The ResumableDistributedSampler state inside ``StatefulDataLoader.state_dict()``.

    It reflects exactly the batches the loader has yielded, whatever its
    ``num_workers`` and prefetching.
    """
    root: object = loader_state
    if _SNAPSHOT in loader_state:  # the multi-worker layout
        steps = loader_state.get(_STEPS_SINCE_SNAPSHOT, 0)
        if steps:
            raise ConfigError(
                f"the loader state is {steps} steps past its last snapshot, so the sampler "
                "position at the last yielded batch is unknown",
                field="snapshot_every_n_steps",
                hint="Build the StatefulDataLoader with snapshot_every_n_steps=1 (its default)",
            )
        root = loader_state[_SNAPSHOT].get(_MAIN_SNAPSHOT, {})
    found: list[dict[str, Any]] = []
    _find_states(root, found)
    if not found:
        raise ConfigError(
            "no ResumableDistributedSampler state in this loader state",
            field="loader_state",
            hint="Pass StatefulDataLoader(..., sampler=ResumableDistributedSampler(...)).state_dict()",
        )
    if any(state != found[0] for state in found[1:]):
        raise ConfigError(
            f"the loader state holds {len(found)} different sampler states: {found}",
            field="loader_state",
            hint="Use one ResumableDistributedSampler per loader",
        )
    return found[0]
