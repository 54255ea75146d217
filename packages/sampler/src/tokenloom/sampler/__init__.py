"""tokenloom.sampler: a distributed sampler that resumes on any world size, in O(1) memory.

    (seed, epoch, N) -> epoch order (a keyed Feistel bijection of [0, N))
        -> rank r of W takes global positions c + r, c + r + W, ...   (c: consumed so far)
        -> state_dict() = {epoch, consumed, ...}: load it on any W and continue

Example::

    sampler = ResumableDistributedSampler(dataset, seed=1234)  # rank/world from torch.distributed
    loader = StatefulDataLoader(dataset, sampler=sampler, batch_size=8)
    ...
    state = sampler_state_from_loader(loader.state_dict())  # what the loader actually yielded
    # later, on another number of ranks or workers:
    sampler.load_state_dict(state)

It also owns the mixing schedules (:class:`MixSchedule`, :class:`CurriculumSchedule`):
which source serves each global position, computed in O(1) memory, never stored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenloom.formats.io import lazy_exports
from tokenloom.sampler._block import (
    DEFAULT_BLOCK_SAMPLES,
    DEFAULT_WINDOW_BLOCKS,
    MAX_BLOCK_SAMPLES,
    MAX_WINDOW_BLOCKS,
    BlockOrder,
)
from tokenloom.sampler._feistel import FeistelPermutation, round_keys
from tokenloom.sampler._identity import check_objects, data_fingerprint, data_objects
from tokenloom.sampler._loader import sampler_state_from_loader
from tokenloom.sampler._mix import MixSchedule
from tokenloom.sampler._schedule import CurriculumSchedule, Drain, Segment, bucket_order
from tokenloom.sampler._warnings import silence_torchdata_set_vital

if TYPE_CHECKING:
    from tokenloom.sampler._order import Order
    from tokenloom.sampler._sampler import ResumableDistributedSampler

# torchdata's StatefulDataLoader calls a torch function that is gone; every package that resumes
# through it (datasets, curriculum, hf-streaming) imports this one.
silence_torchdata_set_vital()

#: The names that need torch, imported on first use: the schedules and the Feistel permutation are
#: numpy only, so planning a curriculum (``tokenloom validate --curriculum``) imports no torch.
_EXPORTS = {
    "Order": "tokenloom.sampler._order",
    "ResumableDistributedSampler": "tokenloom.sampler._sampler",
}

__all__ = [
    "DEFAULT_BLOCK_SAMPLES",
    "DEFAULT_WINDOW_BLOCKS",
    "MAX_BLOCK_SAMPLES",
    "MAX_WINDOW_BLOCKS",
    "BlockOrder",
    "CurriculumSchedule",
    "Drain",
    "FeistelPermutation",
    "MixSchedule",
    "Order",
    "ResumableDistributedSampler",
    "Segment",
    "bucket_order",
    "check_objects",
    "data_fingerprint",
    "data_objects",
    "round_keys",
    "sampler_state_from_loader",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)
