"""Which global positions one rank takes from a resume point to the end of the epoch.

Pure arithmetic shared by the sampler and its state: rank ``r`` of ``W`` takes
positions ``start + r, start + r + W, ...`` (torch's DistributedSampler
convention, counted from the resume point). The tail policy decides the end:

- ``pad``: every rank takes ceil(R / W) positions; positions past ``n`` wrap to
  the start of the epoch order (as DistributedSampler pads), so ranks stay equal;
- ``drop``: every rank takes floor(R / W); the last ``R mod W`` positions are dropped;
- ``exact``: rank r takes the positions that exist; counts differ by at most one.

Here ``R = n - start`` is what is left of the epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

__all__ = ["RankPlan", "Tail", "plan_rank"]


class Tail(StrEnum):
    """What happens when the rest of the epoch does not divide by the world size."""

    PAD = "pad"
    DROP = "drop"
    EXACT = "exact"


@dataclass(frozen=True, slots=True)
class RankPlan:
    """One rank's share of the rest of an epoch."""

    n: int
    start: int
    """Global position the epoch resumes from (samples consumed before)."""
    num_replicas: int
    rank: int
    count: int
    """How many samples this rank yields."""
    padded: int
    """Positions past ``n`` (repeats of the epoch's first indices) over all ranks."""
    dropped: int
    """Indices of the epoch no rank yields (``Tail.DROP`` only)."""

    def positions(self, first: int, stop: int) -> np.ndarray:
        """Epoch positions of this rank's samples ``first .. stop - 1``, padding wrapped."""
        base = self.start + self.rank
        positions = np.arange(
            base + first * self.num_replicas, base + stop * self.num_replicas, self.num_replicas, dtype=np.int64
        )
        if self.padded:
            beyond = positions >= self.n
            positions[beyond] = (positions[beyond] - self.n) % self.n
        return positions

    def consumed_after(self, yielded: int, tail: Tail) -> int:
        """Global samples consumed once every rank has yielded ``yielded`` (lock-step)."""
        if tail is Tail.DROP and yielded >= self.count > 0:
            return self.n  # the dropped tail counts as consumed once the epoch is done
        return min(self.start + yielded * self.num_replicas, self.n)


def plan_rank(n: int, start: int, num_replicas: int, rank: int, tail: Tail) -> RankPlan:
    remaining = n - start
    padded = dropped = 0
    if tail is Tail.PAD:
        count = -(-remaining // num_replicas)
        padded = count * num_replicas - remaining
    elif tail is Tail.DROP:
        count = remaining // num_replicas
        dropped = remaining - count * num_replicas
    else:
        count = max(0, -(-(remaining - rank) // num_replicas))
    return RankPlan(n, start, num_replicas, rank, count, padded, dropped)  # the fields in their order
