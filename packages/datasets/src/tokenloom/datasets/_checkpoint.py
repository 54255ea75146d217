"""The data position as a ``torch.distributed.checkpoint`` (DCP) ``Stateful``: resumed on any world size.

Why: torchtitan-style loops checkpoint everything through DCP, which calls ``state_dict()`` on each
``Stateful`` value at save and ``load_state_dict()`` after load. torchtitan's own loader state is per rank
(pickled bytes keyed by rank, refused on another data-parallel size); the sampler's state is one position on
any topology, so one entry serves every rank and a resume on another world size re-partitions what is left.

How it is stored: DCP keeps non-tensor values by ``torch.save`` (and reads them with ``torch.load``), once
for all ranks when every rank holds the same value under the same key. The state goes in as one JSON
string, not as a nested dict: DCP flattens dicts into one entry per field and loads only the fields the
*current* template has, so a field saved and absent now (a remote object's identity) would vanish without a
word. One string arrives whole and is checked field by field by the sampler (ResumeMismatchError).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

from tokenloom.formats.errors import ConfigError, FormatError
from tokenloom.sampler import ResumableDistributedSampler, sampler_state_from_loader

__all__ = ["STATE_ENTRY", "SamplerCheckpoint"]

#: the key of the JSON state inside this object's DCP state dict
STATE_ENTRY = "tokenloom_sampler_json"


class SamplerCheckpoint:
    """A DCP ``Stateful`` over a :class:`~tokenloom.sampler.ResumableDistributedSampler` or the loader around it.

    With a torchdata ``StatefulDataLoader`` the saved state is the sampler's position at the last batch the
    loader *yielded* (its workers' read-ahead excluded); with a plain sampler (or a DataLoader with
    ``num_workers=0``, which draws indices only as it yields) it is the sampler's own state. Loading moves the
    sampler; iterate the loader afresh after it.

        state = {"model": model_state, "optimizer": optim_state, "data": SamplerCheckpoint(loader)}
        dcp.save(state, checkpoint_id=path)      # every rank; the data entry is written once
        dcp.load(state, checkpoint_id=path)      # any number of ranks: the sampler continues the order
    """

    def __init__(self, loader_or_sampler: Any) -> None:
        if isinstance(loader_or_sampler, ResumableDistributedSampler):
            self.sampler, self.loader = loader_or_sampler, None
        elif isinstance(getattr(loader_or_sampler, "sampler", None), ResumableDistributedSampler):
            self.sampler, self.loader = loader_or_sampler.sampler, loader_or_sampler
        else:
            raise ConfigError(
                f"SamplerCheckpoint takes a ResumableDistributedSampler or a loader built on one, "
                f"got {type(loader_or_sampler).__name__}",
                field="loader_or_sampler",
                hint="Pass StatefulDataLoader(dataset, sampler=ResumableDistributedSampler(dataset)) or the sampler",
            )

    def sampler_state(self) -> dict[str, Any]:
        """The position to resume from (see the class docstring for what counts as consumed)."""
        loader_state = getattr(self.loader, "state_dict", None)
        if callable(loader_state):
            return sampler_state_from_loader(cast("Mapping[str, Any]", loader_state()))
        if self.loader is not None and getattr(self.loader, "num_workers", 0) > 0:
            raise ConfigError(
                f"a plain DataLoader with num_workers={self.loader.num_workers} draws indices ahead of the batches "
                "it yields, so its sampler's position is not what training consumed",
                field="loader_or_sampler",
                hint="Use torchdata's StatefulDataLoader (same arguments), or num_workers=0",
            )
        return self.sampler.state_dict()

    def state_dict(self) -> dict[str, Any]:
        return {STATE_ENTRY: json.dumps(self.sampler_state(), sort_keys=True)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        hint = "Load a checkpoint saved with SamplerCheckpoint, or start the data from the beginning"
        text = state_dict.get(STATE_ENTRY) if isinstance(state_dict, dict) else None
        if not isinstance(text, str):
            raise FormatError(
                f"the checkpoint's data entry holds {type(text).__name__}, expected the sampler state as a JSON string",
                field=STATE_ENTRY,
                hint=hint,
            )
        try:
            state = json.loads(text)
        except ValueError as exc:
            raise FormatError(
                f"the checkpoint's sampler state is not JSON ({exc})", field=STATE_ENTRY, hint=hint
            ) from None
        self.sampler.load_state_dict(state)  # ResumeMismatchError for another dataset, seed or order
        reset = getattr(self.loader, "load_state_dict", None)
        if callable(reset):
            # StatefulDataLoader: an empty state drops the iterator it built for DCP's template state_dict()
            # (before the sampler moved), so the next iteration starts from the loaded position
            reset({})
