"""Fingerprints and the resume-state check every positioned dataset shares (DESIGN contract 3).

Data in object storage adds each object's identity (``{URL: "size:ETag"}``) to the fingerprint and to
every saved state, so a state saved on other bytes is refused with the object that changed named.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from tokenloom.datasets._byte_ranges import block_array
from tokenloom.formats import ResumeMismatchError, TokenDataset
from tokenloom.sampler import check_objects

__all__ = [
    "DATA_OBJECTS_KEY",
    "FingerprintState",
    "check_state",
    "data_fingerprint",
    "data_objects",
    "settings_fingerprint",
    "with_objects",
]

#: the state key holding ``{URL: "size:ETag"}`` of the remote objects the state was saved on
DATA_OBJECTS_KEY = "data_objects"


def settings_fingerprint(**settings: Any) -> str:
    """A short stable hash of JSON-able settings (keys sorted)."""
    blob = json.dumps(settings, sort_keys=True, default=str).encode()
    return hashlib.blake2b(blob, digest_size=12).hexdigest()


def data_objects(dataset: TokenDataset) -> dict[str, str]:
    """``{URL: "size:ETag"}`` of every object of a dataset in object storage; {} for local data."""
    found = dataset.metadata.get("remote_objects")
    objects = {str(k): str(v) for k, v in found.items()} if isinstance(found, Mapping) else {}
    for shard in dataset.shards:  # the token objects, also where a reader records no map
        obj = getattr(block_array(shard), "obj", None)
        if obj is not None:
            objects.setdefault(obj.url, f"{obj.size}:{obj.etag}")
    return dict(sorted(objects.items()))


def data_fingerprint(dataset: TokenDataset) -> str:
    """The manifest fingerprint, or (formats without one) a hash of shard names, sizes and entry counts
    (with remote objects' sizes and ETags)."""
    if dataset.fingerprint:
        return dataset.fingerprint
    shards = [(s.tokens_path.name, s.tokens_offset, s.num_tokens, s.num_entries) for s in dataset.shards]
    objects = data_objects(dataset)
    if objects:
        return settings_fingerprint(format=dataset.format, shards=shards, dtype=dataset.dtype.name, objects=objects)
    return settings_fingerprint(format=dataset.format, shards=shards, dtype=dataset.dtype.name)


def with_objects(state: dict[str, Any], objects: Mapping[str, str]) -> dict[str, Any]:
    """``state`` with the remote objects' identities (only when there are any: local states are unchanged)."""
    if objects:
        state[DATA_OBJECTS_KEY] = dict(objects)
    return state


def check_state(
    state: Any, *, fingerprint: str, owner: str, objects: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """``state`` as a dict whose fingerprint matches, or ResumeMismatchError (naming a changed remote object)."""
    if not isinstance(state, dict) or "fingerprint" not in state:
        raise ResumeMismatchError(f"{owner} state {state!r} has no fingerprint", field="fingerprint")
    if state["fingerprint"] != fingerprint:
        check_objects(
            state.get(DATA_OBJECTS_KEY),
            objects or {},
            what=f"{owner} state was saved on other data: ",
            field="fingerprint",
        )
        raise ResumeMismatchError(
            f"{owner} state was saved for fingerprint {state['fingerprint']!r}, this one is {fingerprint!r}",
            field="fingerprint",
        )
    return state


class FingerprintState:
    """Mixin of a dataset whose position the sampler holds: its state is its fingerprint (with the identities of
    its objects in storage), and a state of other data or settings is refused on load."""

    _fingerprint: str

    def fingerprint(self) -> str:
        """Changes whenever the data or a setting that changes the samples changes."""
        return self._fingerprint

    def data_objects(self) -> dict[str, str]:
        """``{URL: "size:ETag"}`` of the objects in storage this dataset's token stream reads ({} on disk, or
        without a token stream); saved in states."""
        stream = getattr(self, "_stream", None)
        return data_objects(stream) if stream is not None else {}

    def state_dict(self) -> dict[str, Any]:
        """No position of its own (the sampler holds it); the fingerprint guards a resume."""
        return with_objects({"fingerprint": self._fingerprint}, self.data_objects())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, fingerprint=self._fingerprint, owner=type(self).__name__, objects=self.data_objects())
