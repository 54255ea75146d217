"""Bin-packing plans: pure functions ``(lengths, capacity) -> bin of every item``.

Both algorithms are deterministic (ties broken by item index, then bin age) and
work on groups of equal-length items at once, so the Python-level work grows
with the number of *distinct* lengths and bins touched, not with the number of
items: 10^7 documents plan in seconds.
"""

from __future__ import annotations

from collections import deque
from enum import StrEnum

import numpy as np

from tokenloom.datasets._packing_mode import check_choice
from tokenloom.formats import ConfigError

__all__ = ["PackingAlgorithm", "best_fit_decreasing", "length_binned_greedy", "pack_order", "plan_bins"]


class PackingAlgorithm(StrEnum):
    """How whole documents are assigned to fixed-length sequences."""

    BEST_FIT = "best-fit"
    """Best-fit decreasing (OLMo-core's OBFD): longest first, each into the fullest sequence it fits."""
    GREEDY = "greedy"
    """Length-binned greedy (GPT-Simple's legacy jsonl path): length bins longest first, next-fit.

    Not what GPT-Simple's pretokenized path does: its PreTokenizedDataset packs
    first-fit-decreasing over buffers of 256 documents of a per-shard shuffle.
    """


def _check(lengths: np.ndarray, capacity: int) -> np.ndarray:
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.ndim != 1:
        raise ConfigError(f"lengths have shape {lengths.shape}, expected 1-D", field="lengths")
    if capacity < 1:
        raise ConfigError(f"capacity is {capacity}, expected >= 1", field="seq_len")
    if len(lengths) and (lengths.min() < 0 or lengths.max() > capacity):
        raise ConfigError(
            f"item lengths span [{int(lengths.min())}, {int(lengths.max())}], expected within [0, {capacity}]",
            field="lengths",
            hint="Split items longer than seq_len first",
        )
    return lengths


def best_fit_decreasing(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """Bin id of every item (-1 for empty items) under best-fit decreasing.

    Equal to placing items one at a time, longest first (ties: lower index
    first), each into the open bin with the least remaining room that fits it
    (ties: the bin that reached that room first), opening a new bin otherwise.
    """
    lengths = _check(lengths, capacity)
    bin_of = np.full(len(lengths), -1, dtype=np.int64)
    if len(lengths) == 0:
        return bin_of
    order = np.argsort(-lengths, kind="stable")
    sorted_lengths = lengths[order]
    group_starts = np.flatnonzero(np.diff(sorted_lengths, prepend=-1))
    group_ends = np.append(group_starts[1:], len(order))
    room_count = np.zeros(capacity + 1, dtype=np.int64)  # open bins by remaining room
    bins_at: dict[int, deque[np.ndarray]] = {}
    next_bin = 0

    def push(room: int, bins: np.ndarray) -> None:
        if room > 0 and len(bins):
            bins_at.setdefault(room, deque()).append(bins)
            room_count[room] += len(bins)

    for start, end in zip(group_starts.tolist(), group_ends.tolist(), strict=True):
        length = int(sorted_lengths[start])
        if length == 0:
            continue
        items = order[start:end]
        placed, total = 0, end - start
        for room in (length + np.flatnonzero(room_count[length:])).tolist():
            per_bin = room // length  # a bin keeps taking items while it is the best fit
            queue = bins_at[room]
            while queue and placed < total:
                chunk = queue.popleft()
                needed = -(-(total - placed) // per_bin)
                if len(chunk) > needed:
                    queue.appendleft(chunk[needed:])
                    chunk = chunk[:needed]
                take = min(total - placed, len(chunk) * per_bin)
                bin_of[items[placed : placed + take]] = np.repeat(chunk, per_bin)[:take]
                placed += take
                room_count[room] -= len(chunk)
                full, rest = divmod(take, per_bin)
                push(room - per_bin * length, chunk[:full])
                if rest:
                    push(room - rest * length, chunk[full : full + 1])
            if not queue:
                bins_at.pop(room, None)
            if placed == total:
                break
        if placed < total:
            remaining = total - placed
            per_bin = capacity // length
            new_bins = np.arange(next_bin, next_bin + -(-remaining // per_bin), dtype=np.int64)
            next_bin += len(new_bins)
            bin_of[items[placed:]] = np.repeat(new_bins, per_bin)[:remaining]
            full, rest = divmod(remaining, per_bin)
            push(capacity - per_bin * length, new_bins[:full])
            if rest:
                push(capacity - rest * length, new_bins[full:])
    return bin_of


def length_binned_greedy(lengths: np.ndarray, capacity: int, *, bin_width: int = 64) -> np.ndarray:
    """Bin id of every item (-1 for empty items) under GPT-Simple's length-binned greedy.

    Items are grouped into length bins ``[k * bin_width, (k + 1) * bin_width)``,
    longest bin first, dataset order inside a bin, then packed next-fit: an item
    goes into the current sequence if it fits, else it starts a new one.
    """
    lengths = _check(lengths, capacity)
    if bin_width < 1:
        raise ConfigError(f"bin_width is {bin_width}, expected >= 1", field="bin_width")
    bin_of = np.full(len(lengths), -1, dtype=np.int64)
    keep = np.flatnonzero(lengths > 0)
    if len(keep) == 0:
        return bin_of
    key = -(lengths[keep] // bin_width)
    if capacity // bin_width < 2**15:  # numpy sorts 16-bit keys by radix, stably
        key = key.astype(np.int16)
    order = keep[np.argsort(key, kind="stable")]
    ends = np.cumsum(lengths[order])
    count = len(order)
    # next-fit is a chain: a sequence that starts at item i ends before the first item whose end
    # passes (end before i) + capacity, and at least holds item i. Those ends come out of one
    # vectorised search; only the walk along the chain (one step per sequence) is a loop.
    before = np.concatenate([np.zeros(1, dtype=np.int64), ends[:-1]])
    following = np.searchsorted(ends, before + capacity, side="right")
    np.maximum(following, np.arange(1, count + 1), out=following)
    del before
    opens = np.zeros(count, dtype=np.int8)
    step, mark = following.data, opens.data  # memoryviews: plain int indexing, no numpy scalar per step
    start = 0
    while start < count:
        mark[start] = 1
        start = step[start]
    bin_of[order] = np.cumsum(opens, dtype=np.int64) - 1
    return bin_of


def plan_bins(lengths: np.ndarray, capacity: int, algorithm: PackingAlgorithm | str, **options: int) -> np.ndarray:
    """Dispatch to the named algorithm."""
    chosen = check_choice(PackingAlgorithm, algorithm, "algorithm", "packing algorithm")
    if chosen is PackingAlgorithm.BEST_FIT:
        return best_fit_decreasing(lengths, capacity)
    return length_binned_greedy(lengths, capacity, **options)


def pack_order(bin_of: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Items in pack order (by bin, longest first inside a bin) and the bin offsets into that order."""
    placed = np.flatnonzero(bin_of >= 0)
    order = placed[np.lexsort((placed, -np.asarray(lengths)[placed], bin_of[placed]))]
    counts = np.bincount(bin_of[placed], minlength=int(bin_of.max()) + 1 if len(placed) else 0)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return order, offsets
