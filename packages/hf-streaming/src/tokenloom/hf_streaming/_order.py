"""The global document order, as counters: unit order, block shuffle, dealing, remainders.

    epoch e:  units permuted by (seed, e)           (the sampler's keyed Feistel permutation)
    unit u:   read in blocks of B records; block b permuted by (seed, e, u, b)
    slots:    the epoch's pending list dealt in order, each item to the slot with the fewest bytes so far
              (ties: the lowest slot), so equal units go round-robin and unequal ones balance by size

A position is (epoch, item index in the slot's list, row in the unit's shuffled
order, token offset in that row's document): everything before it is consumed.
A :class:`Base` is what a resume starts from: per epoch, the units already done
and the units partly done (with their position); epochs before ``start`` are
complete, epochs not listed are fresh. Pending items of an epoch are its partial
units first (in unit order), then its untouched units (in unit order).
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from tokenloom.sampler import FeistelPermutation, round_keys

__all__ = ["Base", "EpochRemainder", "Item", "block_order", "deal", "pending_items", "slot_items", "unit_order"]


def unit_order(n_units: int, seed: int, epoch: int) -> np.ndarray:
    """Unit ids in epoch order."""
    if n_units <= 1:
        return np.arange(n_units, dtype=np.int64)
    return FeistelPermutation(n_units, round_keys(seed, epoch))(np.arange(n_units, dtype=np.int64))


def block_order(size: int, seed: int, epoch: int, unit: int, block: int) -> np.ndarray:
    """Which record of a block (source order) sits at each shuffled position."""
    if size <= 1:
        return np.arange(size, dtype=np.int64)
    key = xxhash.xxh64_intdigest(struct.pack("<qqqq", seed, epoch, unit, block))
    return FeistelPermutation(size, round_keys(key, epoch))(np.arange(size, dtype=np.int64))


@dataclass(frozen=True, slots=True)
class Item:
    """A unit to read and where to start in it."""

    unit: int
    row: int = 0
    token: int = 0
    hint: int = -1

    @property
    def fresh(self) -> bool:
        return self.row == 0 and self.token == 0


@dataclass(slots=True)
class EpochRemainder:
    done: set[int] = field(default_factory=set)
    partial: dict[int, Item] = field(default_factory=dict)

    def to_json(self, epoch: int) -> dict[str, Any]:
        return {
            "epoch": epoch,
            "done": _ranges(sorted(self.done)),
            "partial": [[i.unit, i.row, i.token, i.hint] for i in sorted(self.partial.values(), key=lambda i: i.unit)],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EpochRemainder:
        done = {u for a, b in data["done"] for u in range(a, b)}
        partial = {int(p[0]): Item(int(p[0]), int(p[1]), int(p[2]), int(p[3])) for p in data["partial"]}
        return cls(done, partial)


def _ranges(values: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for v in values:
        if out and out[-1][1] == v:
            out[-1][1] = v + 1
        else:
            out.append([v, v + 1])
    return out


@dataclass(slots=True)
class Base:
    """Where a run segment starts: epochs < start complete, listed epochs partly done, the rest fresh."""

    start: int = 0
    epochs: dict[int, EpochRemainder] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"start": self.start, "epochs": [r.to_json(e) for e, r in sorted(self.epochs.items())]}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Base:
        if data is None:
            return cls()
        return cls(int(data["start"]), {int(e["epoch"]): EpochRemainder.from_json(e) for e in data["epochs"]})


def pending_items(base: Base, n_units: int, seed: int, epoch: int) -> list[Item]:
    """The items of ``epoch`` still to read, in pending order (partials first)."""
    if epoch < base.start:
        return []
    order = unit_order(n_units, seed, epoch)
    remainder = base.epochs.get(epoch)
    if remainder is None:
        return [Item(int(u)) for u in order]
    partial = [remainder.partial[int(u)] for u in order if int(u) in remainder.partial]
    untouched = [Item(int(u)) for u in order if int(u) not in remainder.done and int(u) not in remainder.partial]
    return partial + untouched


def deal(items: list[Item], slots: int, sizes: Sequence[int] | None = None) -> list[list[Item]]:
    """Each item, in order, to the slot with the least work so far (ties: the lowest slot)."""
    dealt: list[list[Item]] = [[] for _ in range(slots)]
    heap = [(0, slot) for slot in range(slots)]
    for item in items:
        load, slot = heapq.heappop(heap)
        dealt[slot].append(item)
        heapq.heappush(heap, (load + (max(1, sizes[item.unit]) if sizes is not None else 1), slot))
    return dealt


def slot_items(
    base: Base, n_units: int, seed: int, epoch: int, slot: int, slots: int, sizes: Sequence[int] | None = None
) -> list[Item]:
    return deal(pending_items(base, n_units, seed, epoch), slots, sizes)[slot]


def remainder_after(
    base: Base,
    n_units: int,
    seed: int,
    slots: int,
    positions: dict[int, tuple[int, int, Item | None]],
    sizes: Sequence[int] | None = None,
) -> Base:
    """The new base once each slot has reached its position.

    ``positions[slot] = (epoch, item index, current item or None)`` where the
    current item carries the slot's row, token and hint in its unit.
    """
    # epochs the old base lists beyond every slot keep their partial state
    last = max([p[0] for p in positions.values()] + list(base.epochs))
    first = min(p[0] for p in positions.values())
    new = Base(start=max(base.start, first))
    for epoch in range(new.start, last + 1):
        pending = pending_items(base, n_units, seed, epoch)
        remainder = EpochRemainder(done=set(range(n_units)) - {i.unit for i in pending})
        dealt = deal(pending, slots, sizes)
        for slot, (slot_epoch, index, current) in positions.items():
            items = dealt[slot]
            for k, item in enumerate(items):
                if epoch < slot_epoch or (epoch == slot_epoch and k < index):
                    remainder.done.add(item.unit)
                elif epoch == slot_epoch and k == index and current is not None:
                    remainder.partial[item.unit] = current
                elif not item.fresh:
                    remainder.partial[item.unit] = item
        new.epochs[epoch] = remainder
    while new.start in new.epochs and _complete(new.epochs[new.start], n_units):
        del new.epochs[new.start]
        new.start += 1
    return new


def _complete(remainder: EpochRemainder, n_units: int) -> bool:
    return not remainder.partial and len(remainder.done) >= n_units
