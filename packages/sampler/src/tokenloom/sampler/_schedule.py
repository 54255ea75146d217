"""Curriculum schedules: token-budget phases over buckets, cut at drain points, in O(1) memory.

**A curriculum** (:class:`CurriculumSchedule`): phases with token budgets and
weights over buckets, each bucket holding a known number of samples and budget
tokens. Weights are in tokens: a bucket's sample rate is ``w / tokens_per_sample``.
Phases are cut into segments at every point where a bucket runs dry (its draws
reach its capacity); a new segment renormalises the remaining buckets. Every
boundary is found at construction by inverting the monotone per-bucket counts
(binary search), so a lookup is a ``searchsorted`` over O(phases + buckets)
segment starts plus a tree walk. Inside a bucket the ``j``-th draw is epoch
``j // n`` and index ``feistel(seed, bucket, epoch)(j % n)``; a bucket given a block order
(``orders[b] = (block_samples, window_blocks)``) takes ``BlockOrder`` instead of the global Feistel
bijection (the sampler's ``order="block"``): its draws stay inside one window of blocks at a time, so a
bucket in object storage is read in runs (fetched ~ used bytes) and the schedule is still O(1).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tokenloom.formats.errors import ConfigError
from tokenloom.sampler._block import MAX_BLOCK_SAMPLES, MAX_WINDOW_BLOCKS, BlockOrder
from tokenloom.sampler._feistel import FeistelPermutation, round_keys
from tokenloom.sampler._mix import _FRACTION_BITS, _HALF, MAX_SEGMENT, MixSchedule, Tree, first_reaching, mix64

__all__ = ["CurriculumSchedule", "Drain", "Segment", "bucket_order"]

_CHUNK = 1 << 15
_MASK64 = (1 << 64) - 1
_SCALAR_BELOW = 48
_TABLE_LIMIT = 1 << 20
_TABLE_BUDGET = 1 << 23


def bucket_order(
    seed: int, bucket: int, epoch: int, size: int, block: tuple[int, int] | None = None
) -> FeistelPermutation | BlockOrder:
    """One bucket epoch's order: the global Feistel bijection (the sampler's network), or with ``block =
    (block_samples, window_blocks)`` the block-local one (same key: the bucket's seed and the epoch)."""
    key = mix64(seed, 0xB0C4E7, bucket)
    if block is None:
        return FeistelPermutation(size, round_keys(key, epoch))
    block_samples, window_blocks = block
    return BlockOrder(size, seed=key, epoch=epoch, block_samples=block_samples, window_blocks=window_blocks)


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of one phase with one set of active buckets."""

    phase: int
    start: int
    """First global sample position."""
    end: int
    """One past the last position."""
    weights: tuple[float, ...]
    """Token weights over every bucket in this segment (renormalised over the active ones)."""
    base: tuple[int, ...]
    """Draws of every bucket before this segment."""


@dataclass(frozen=True, slots=True)
class Drain:
    """Where a bucket runs dry: the first position that would need one sample more than it has."""

    bucket: int
    position: int
    phase: int
    tokens: int
    """Budget tokens of the curriculum before ``position``."""
    epochs: int
    """Epochs of the bucket read by then."""


@dataclass(slots=True)
class _Builder:
    samples: list[int]
    tokens: list[int]
    capacity: list[int]
    drawn: list[int] = field(default_factory=list)

    def tokens_of(self, bucket: int, draws: int) -> int:
        """Budget tokens of a bucket's first ``draws`` draws (exact for constant sizes; mean otherwise)."""
        return (draws * self.tokens[bucket]) // self.samples[bucket]


class CurriculumSchedule:
    """Global sample position -> (phase, bucket, index inside the bucket), from the plan alone.

    Args:
        bucket_samples: samples in each bucket (one epoch).
        bucket_tokens: budget tokens over one epoch of each bucket.
        durations: token budget of every phase.
        weights: ``(phases, buckets)`` token weights (rows need not be normalised).
        seed: keys the in-bucket permutations and the interleavings.
        max_epochs: epochs a bucket may be read before it drains (1 = each sample at most once).
        shuffle: False reads each bucket epoch in storage order.
        orders: per bucket, None (the global Feistel order) or ``(block_samples, window_blocks)``: the
            block-local order of :class:`~tokenloom.sampler._block.BlockOrder`. Only the in-bucket
            order changes: which bucket serves each position (the mix) does not.
    """

    def __init__(
        self,
        bucket_samples: Sequence[int],
        bucket_tokens: Sequence[int],
        durations: Sequence[int],
        weights: np.ndarray | Sequence[Sequence[float]],
        *,
        seed: int,
        max_epochs: int = 1,
        shuffle: bool = True,
        orders: Sequence[tuple[int, int] | None] | None = None,
    ) -> None:
        self.bucket_samples = [int(n) for n in bucket_samples]
        self.bucket_tokens = [int(t) for t in bucket_tokens]
        self.durations = [int(d) for d in durations]
        self.weights = np.asarray(weights, dtype=np.float64)
        if self.weights.shape != (len(self.durations), len(self.bucket_samples)):
            raise ConfigError(
                f"weights have shape {self.weights.shape}, expected (phases, buckets) = "
                f"({len(self.durations)}, {len(self.bucket_samples)})",
                field="weights",
            )
        if not np.isfinite(self.weights).all() or (self.weights < 0).any():
            raise ConfigError("weights must be finite and non-negative", field="weights")
        if any(d < 1 for d in self.durations):
            raise ConfigError(f"durations {self.durations} must all be >= 1 token", field="duration_tokens")
        self.seed = int(seed) & _MASK64
        self.max_epochs = int(max_epochs)
        self.shuffle = bool(shuffle)
        self.orders: list[tuple[int, int] | None] = list(orders) if orders is not None else [None] * len(bucket_samples)
        if len(self.orders) != len(self.bucket_samples):
            raise ConfigError(
                f"orders has {len(self.orders)} entries, expected one per bucket ({len(self.bucket_samples)})",
                field="order",
            )
        for b, block in enumerate(self.orders):
            if block is not None and (
                len(block) != 2
                or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in block)
                or block[0] > MAX_BLOCK_SAMPLES
                or block[1] > MAX_WINDOW_BLOCKS
            ):
                raise ConfigError(
                    f"orders[{b}] is {block!r}, expected None or (block_samples, window_blocks), both >= 1 "
                    f"and at most ({MAX_BLOCK_SAMPLES}, {MAX_WINDOW_BLOCKS})",
                    field="order",
                )
        if any(n < 0 for n in self.bucket_samples) or any(
            t <= 0 < n for n, t in zip(self.bucket_samples, self.bucket_tokens, strict=True)
        ):
            raise ConfigError(
                "bucket sizes must be non-negative, with tokens wherever there are samples", field="buckets"
            )
        if self.max_epochs < 1:
            raise ConfigError(f"max_epochs is {self.max_epochs}, expected >= 1", field="max_repetition")
        self.segments: list[Segment] = []
        self.drains: list[Drain] = []
        self.phase_bounds: list[tuple[int, int]] = []
        self.phase_tokens: list[int] = []
        self.ended_early: str | None = None
        self._mixes: list[MixSchedule] = []
        self._permutations: dict[tuple[int, int], FeistelPermutation | BlockOrder] = {}
        self._tables: dict[tuple[int, int], np.ndarray] = {}
        self._table_views: dict[tuple[int, int], memoryview] = {}
        self._build()
        self._pack()

    # -- construction ------------------------------------------------------------------
    def _build(self) -> None:
        buckets = len(self.bucket_samples)
        builder = _Builder(
            samples=self.bucket_samples,
            tokens=self.bucket_tokens,
            capacity=[n * self.max_epochs for n in self.bucket_samples],
            drawn=[0] * buckets,
        )
        position, spent, target = 0, 0, 0
        drained: set[int] = set()
        for phase, duration in enumerate(self.durations):
            target += duration
            phase_start, phase_spent = position, spent
            while spent < target and self.ended_early is None:
                wanted = [b for b in range(buckets) if self.weights[phase, b] > 0]
                for b in wanted:
                    if builder.drawn[b] >= builder.capacity[b] and b not in drained:
                        drained.add(b)
                        epochs = builder.drawn[b] // max(1, self.bucket_samples[b])
                        self.drains.append(Drain(b, position, phase, spent, epochs))
                active = [b for b in wanted if builder.drawn[b] < builder.capacity[b]]
                if not active:
                    self.ended_early = (
                        f"phase {phase} has no bucket left at sample {position} "
                        f"({target - spent} of its budget tokens unserved)"
                    )
                    break
                weights = np.zeros(buckets)
                weights[active] = self.weights[phase, active]
                weights /= weights.sum()
                rates = np.zeros(buckets)
                for b in active:
                    rates[b] = weights[b] * self.bucket_samples[b] / self.bucket_tokens[b]
                mix = MixSchedule(rates, key=mix64(self.seed, 0x5E6, len(self.segments)))
                length = self._segment_length(mix, builder, active, target - spent)
                base = tuple(builder.drawn)
                for b in active:
                    before = builder.tokens_of(b, builder.drawn[b])
                    builder.drawn[b] += mix.count(b, length)
                    spent += builder.tokens_of(b, builder.drawn[b]) - before
                self.segments.append(Segment(phase, position, position + length, tuple(weights.tolist()), base))
                self._mixes.append(mix)
                position += length
            self.phase_bounds.append((phase_start, position))
            self.phase_tokens.append(spent - phase_spent)
            if self.ended_early is not None:
                for _ in range(phase + 1, len(self.durations)):
                    self.phase_bounds.append((position, position))
                    self.phase_tokens.append(0)
                break
        self.num_samples = position
        self.total_tokens = spent
        self.drawn = builder.drawn

    def _segment_length(self, mix: MixSchedule, builder: _Builder, active: list[int], budget: int) -> int:
        """Positions until the phase budget is met or the first active bucket runs dry."""

        def spent(x: int) -> int:
            if x > MAX_SEGMENT:
                raise ConfigError(f"a phase segment needs more than {MAX_SEGMENT} samples", field="duration_tokens")
            return sum(
                builder.tokens_of(b, builder.drawn[b] + mix.count(b, x)) - builder.tokens_of(b, builder.drawn[b])
                for b in active
            )

        length = first_reaching(spent, budget, 1)
        for b in active:
            remaining = builder.capacity[b] - builder.drawn[b]
            # the first position that would need draw number `remaining` (0-based) of b
            dry = mix.first_position_with(b, remaining + 1) - 1
            length = min(length, dry)
        return length

    def _pack(self) -> None:
        self._starts = np.asarray([s.start for s in self.segments], dtype=np.int64)
        self._tree_arrays = Tree(self._mixes, len(self.bucket_samples))
        self._start_list = self._starts.tolist()
        tree = self._tree_arrays
        self._tree_lists = (tree.fraction.tolist(), tree.children.tolist(), tree.source.tolist())
        bases = [segment.base for segment in self.segments]
        self._base = np.asarray(bases, dtype=np.int64).reshape(len(self.segments), len(self.bucket_samples))
        self._phase = np.asarray([s.phase for s in self.segments], dtype=np.int64)
        self._phase_list = [s.phase for s in self.segments]  # Python ints for _locate_few
        self._base_lists = [list(segment.base) for segment in self.segments]

    # -- look-ups ----------------------------------------------------------------------
    def draws(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(phase, bucket, global draw number of the bucket) at each position in [0, num_samples)."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= self.num_samples):
            raise IndexError(f"positions outside [0, {self.num_samples})")
        phase = np.empty_like(positions)
        bucket = np.empty_like(positions)
        draw = np.empty_like(positions)
        tree = self._tree_arrays
        for first in range(0, len(positions), _CHUNK):
            part = positions[first : first + _CHUNK]
            segment = np.searchsorted(self._starts, part, side="right") - 1
            source, rank = tree.walk(part - self._starts[segment], tree.root_array[segment])
            phase[first : first + _CHUNK] = self._phase[segment]
            bucket[first : first + _CHUNK] = source
            draw[first : first + _CHUNK] = self._base[segment, source] + rank
        return phase, bucket, draw

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(phase, bucket, index inside the bucket's samples) at each position."""
        positions = np.asarray(positions, dtype=np.int64)
        if len(positions) <= _SCALAR_BELOW:  # a DataLoader batch: plain Python beats numpy's per-call overhead
            return self._locate_few(positions.tolist())
        phase, bucket, draw = self.draws(positions)
        index = np.empty_like(draw)
        present = np.flatnonzero(np.bincount(bucket, minlength=len(self.bucket_samples)))
        for b in present.tolist():
            rows = np.flatnonzero(bucket == b) if len(present) > 1 else np.arange(len(draw))
            size = self.bucket_samples[b]
            epoch, within = np.divmod(draw[rows], size)
            if not self.shuffle:
                index[rows] = within
                continue
            first, last = int(epoch.min()), int(epoch.max())
            for e in range(first, last + 1):
                pick = slice(None) if first == last else np.flatnonzero(epoch == e)
                index[rows[pick]] = self._permutation(b, e)(within[pick])
        return phase, bucket, index

    def _locate_few(self, positions: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`locate` for a handful of positions, in Python integers (same results)."""
        phases, buckets, indices = self.locate_list(positions)
        as_array = np.asarray
        return as_array(phases, np.int64), as_array(buckets, np.int64), as_array(indices, np.int64)

    def locate_list(self, positions: list[int]) -> tuple[list[int], list[int], list[int]]:
        """:meth:`locate` on a list of Python ints, as lists: the DataLoader-batch path (no numpy per call)."""
        count = len(positions)
        phases, buckets, indices = [0] * count, [0] * count, [0] * count
        starts, roots, tree = self._start_list, self._tree_arrays.roots, self._tree_lists
        fraction, children, source = tree
        segment_phase, segment_base = self._phase_list, self._base_lists
        sizes, shuffle, views, limit = self.bucket_samples, self.shuffle, self._table_views, self.num_samples
        for row, position in enumerate(positions):
            if not 0 <= position < limit:
                raise IndexError(f"positions outside [0, {limit})")
            k = bisect.bisect_right(starts, position) - 1
            x, node = position - starts[k], roots[k]
            while source[node] < 0:
                share = fraction[node]
                before = (share * x + _HALF) >> _FRACTION_BITS
                if (share * (x + 1) + _HALF) >> _FRACTION_BITS > before:
                    x, node = before, children[2 * node]
                else:
                    x, node = x - before, children[2 * node + 1]
            b = source[node]
            epoch, within = divmod(segment_base[k][b] + x, sizes[b])
            phases[row], buckets[row] = segment_phase[k], b
            if not shuffle:
                indices[row] = within
                continue
            view = views.get((b, epoch))  # the table's memoryview: a plain int per look-up
            if view is None:
                table = self._table(b, epoch)
                if table is None:
                    order = self._permutation(b, epoch)
                    if isinstance(order, BlockOrder):
                        indices[row] = int(order(np.asarray([within], dtype=np.int64))[0])
                    else:
                        indices[row] = order.one(within)
                    continue
                view = table.data
            indices[row] = view[within]
        return phases, buckets, indices

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_tables"] = {}  # a per-process cache: rebuilt where it is used, never pickled to workers
        state["_table_views"] = {}  # memoryviews of those tables (they do not pickle either)
        return state

    def _table(self, bucket: int, epoch: int) -> np.ndarray | None:
        """A bucket epoch's permutation as an int32 table, for buckets of at most 2^20 samples.

        A cache for DataLoader-sized look-ups (a table look-up instead of a Python Feistel
        evaluation); at most 2^23 entries (32 MiB) are kept per process, rebuilt on demand.
        """
        size = self.bucket_samples[bucket]
        if size > _TABLE_LIMIT:
            return None
        key = (bucket, epoch)
        table = self._tables.get(key)
        if table is None:
            if sum(len(t) for t in self._tables.values()) + size > _TABLE_BUDGET:
                self._tables.clear()
                self._table_views.clear()
            positions = np.arange(size, dtype=np.int64)
            table = self._tables[key] = self._permutation(bucket, epoch)(positions).astype(np.int32)
            self._table_views[key] = table.data
        return table

    def _permutation(self, bucket: int, epoch: int) -> FeistelPermutation | BlockOrder:
        key = (bucket, epoch)
        permutation = self._permutations.get(key)
        if permutation is None:
            if len(self._permutations) > 256:
                self._permutations.clear()
            permutation = self._permutations[key] = bucket_order(
                self.seed, bucket, epoch, self.bucket_samples[bucket], self.orders[bucket]
            )
        return permutation

    def counts_before(self, position: int) -> np.ndarray:
        """Draws of every bucket before global ``position`` (0 <= position <= num_samples)."""
        if not 0 <= position <= self.num_samples:
            raise IndexError(f"position {position} outside [0, {self.num_samples}]")
        if position == self.num_samples:
            return np.asarray(self.drawn, dtype=np.int64)
        k = int(np.searchsorted(self._starts, position, side="right")) - 1
        mix, segment = self._mixes[k], self.segments[k]
        return np.asarray(segment.base, dtype=np.int64) + mix.counts(position - segment.start)

    def tokens_before(self, position: int) -> int:
        """Budget tokens of the curriculum before ``position`` (the planned unit)."""
        counts = self.counts_before(position)
        sizes = zip(counts.tolist(), self.bucket_tokens, self.bucket_samples, strict=True)
        return sum((c * t) // n if n else 0 for c, t, n in sizes)

    def discrepancy(self) -> float:
        """The largest count deviation bound (samples) over every segment and bucket."""
        return max((mix.discrepancy(b) for mix in self._mixes for b in mix.sources), default=0.0)
