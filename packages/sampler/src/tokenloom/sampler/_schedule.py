"""Mixing schedules: which source (bucket) serves each global sample position, in O(1) memory.

Why: a weighted mixture materialised as an array of its length (Megatron's
BlendedDataset, wave 1's MixtureDataset) costs O(N) time and memory to build,
and a curriculum of 10^12 tokens cannot afford that. Here the source of a
position is computed, never stored.

**One mix** (:class:`MixSchedule`): the active sources are the leaves of a
binary tree whose inner nodes split their share of the positions between their
two children in proportion ``p`` (a 32-bit fixed-point fraction). A node sends
its ``x``-th position left iff ``floor(p (x + 1) + 1/2) > floor(p x + 1/2)``
(a Sturmian, i.e. lowest-discrepancy, sequence), and the position's rank inside
the chosen child is that count. Walking root -> leaf gives the source and how
many earlier positions the source served, in O(depth) integer operations,
vectorised over a batch of positions; the number of draws of a source among the
first ``x`` positions is the same composition along its path. The tree splits
mass as evenly as it can, so every source's count stays within
:meth:`MixSchedule.discrepancy` (< 1 sample for most mixes, reported exactly)
of ``rate * x`` at every prefix. The seed swaps children (keyed splitmix64 per
node): another seed, another interleaving, the same bounds.

**A curriculum** (:class:`CurriculumSchedule`): phases with token budgets and
weights over buckets, each bucket holding a known number of samples and budget
tokens. Weights are in tokens: a bucket's sample rate is ``w / tokens_per_sample``.
Phases are cut into segments at every point where a bucket runs dry (its draws
reach its capacity); a new segment renormalises the remaining buckets. Every
boundary is found at construction by inverting the monotone per-bucket counts
(binary search), so a lookup is a ``searchsorted`` over O(phases + buckets)
segment starts plus a tree walk. Inside a bucket the ``j``-th draw is epoch
``j // n`` and index ``feistel(seed, bucket, epoch)(j % n)``.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tokenloom.formats.errors import ConfigError
from tokenloom.sampler._feistel import FeistelPermutation, round_keys

__all__ = ["CurriculumSchedule", "Drain", "MixSchedule", "Segment", "bucket_permutation"]

_FRACTION_BITS = 22
_ONE = 1 << _FRACTION_BITS
_HALF = 1 << (_FRACTION_BITS - 1)
_SEARCH_LIMIT = 8
MAX_SEGMENT = 1 << 40
"""Positions inside one segment stay below this, so ``p * x`` fits in int64."""
_MASK64 = (1 << 64) - 1


def _mix64(*values: int) -> int:
    """splitmix64 over a tuple of ints: a counter-based hash, no generator object."""
    state = 0x243F6A8885A308D3
    for value in values:
        state = (state ^ (value & _MASK64)) & _MASK64
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        state = z ^ (z >> 31)
    return state


def _split_count(fraction: int, x: int) -> int:
    """Positions among the first ``x`` that a node with left share ``fraction`` sends left."""
    return (fraction * x + _HALF) >> _FRACTION_BITS


class MixSchedule:
    """Source of every position for one fixed mix; sources are ``0 .. len(rates) - 1``.

    Args:
        rates: sample rates per source (any non-negative scale; zeros never drawn).
        key: seeds the children swap of every node (pass e.g. ``hash(seed, phase)``).
    """

    __slots__ = ("_fraction", "_left", "_paths", "_right", "_root", "rates")

    def __init__(self, rates: Sequence[float] | np.ndarray, *, key: int = 0) -> None:
        rates = np.asarray(rates, dtype=np.float64)
        if rates.ndim != 1 or len(rates) == 0 or not np.isfinite(rates).all() or (rates < 0).any():
            raise ConfigError(f"rates {rates.tolist()} must be finite and non-negative", field="weights")
        total = float(rates.sum())
        if total <= 0:
            raise ConfigError("every rate is zero: nothing to draw from", field="weights")
        self.rates = rates / total
        self._fraction: list[int] = []
        self._left: list[int] = []
        self._right: list[int] = []
        active = [int(s) for s in np.flatnonzero(self.rates > 0)]
        self._root = self._build(active, key)
        self._paths: dict[int, list[tuple[int, bool]]] = {}
        self._collect_paths(self._root, [])

    def _build(self, sources: list[int], key: int, error: float = 0.0, memo: dict | None = None) -> int:
        """Node id (>= 0) or a leaf ``-(source + 1)``, split as :meth:`_best_split` chooses."""
        if len(sources) == 1:
            return -(sources[0] + 1)
        memo = {} if memo is None else memo
        left, right = self._best_split(tuple(sources), error, memo)[1]
        node = len(self._fraction)
        self._fraction.append(0)
        self._left.append(0)
        self._right.append(0)
        if _mix64(key, node) & 1:
            left, right = right, left
        share = sum(float(self.rates[s]) for s in left) / sum(float(self.rates[s]) for s in sources)
        fraction = round(share * _ONE)
        if not 0 < fraction < _ONE:
            raise ConfigError(
                f"mix rates {self.rates.tolist()} are too uneven: a share of {share:.3g} does not fit "
                f"{_FRACTION_BITS}-bit fixed point",
                field="weights",
                hint="Drop sources whose weight is below 1e-6 of the largest",
            )
        self._fraction[node] = fraction
        self._left[node] = self._build(sorted(left), key, 0.5 + share * error, memo)
        self._right[node] = self._build(sorted(right), key, 0.5 + (1 - share) * error, memo)
        return node

    def _candidates(self, sources: tuple[int, ...]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """Bipartitions worth trying: the mass-balanced greedy one, and each source moved across."""
        ordered = sorted(sources, key=lambda s: (-self.rates[s], s))
        groups: tuple[list[int], list[int]] = ([], [])
        mass = [0.0, 0.0]
        for source in ordered:
            lighter = 0 if mass[0] <= mass[1] else 1
            groups[lighter].append(source)
            mass[lighter] += float(self.rates[source])
        found = {(tuple(sorted(groups[0])), tuple(sorted(groups[1])))}
        if len(sources) <= _SEARCH_LIMIT:
            for source in sources:
                left = set(groups[0]) ^ {source}
                right = set(sources) - left
                if left and right:
                    found.add((tuple(sorted(left)), tuple(sorted(right))))
        return sorted(found)

    def _best_split(
        self, sources: tuple[int, ...], error: float, memo: dict
    ) -> tuple[float, tuple[tuple[int, ...], tuple[int, ...]]]:
        """(worst leaf bound, split) minimising the worst discrepancy bound below this node.

        A node whose input is off by ``error`` sends a child of share ``p`` counts off by at
        most ``1/2 + p * error``; leaves keep what reaches them.
        """
        if len(sources) == 1:
            return error, ((), ())
        key = (sources, round(error, 6))
        if key in memo:
            return memo[key]
        total = sum(float(self.rates[s]) for s in sources)
        best: tuple[float, tuple[tuple[int, ...], tuple[int, ...]]] | None = None
        for left, right in self._candidates(sources):
            worst = 0.0
            for side in (left, right):
                share = sum(float(self.rates[s]) for s in side) / total
                worst = max(worst, self._best_split(side, 0.5 + share * error, memo)[0])
            if best is None or worst < best[0] - 1e-12:
                best = (worst, (left, right))
        assert best is not None  # noqa: S101 - at least the greedy split exists
        memo[key] = best
        return best

    def _collect_paths(self, node: int, path: list[tuple[int, bool]]) -> None:
        if node < 0:
            self._paths[-node - 1] = path
            return
        self._collect_paths(self._left[node], [*path, (node, True)])
        self._collect_paths(self._right[node], [*path, (node, False)])

    @property
    def sources(self) -> list[int]:
        """Sources with a positive rate, ascending."""
        return sorted(self._paths)

    def count(self, source: int, x: int) -> int:
        """How many of the first ``x`` positions ``source`` serves (exact integers)."""
        path = self._paths.get(source)
        if path is None:
            return 0
        for node, left in path:
            went_left = _split_count(self._fraction[node], x)
            x = went_left if left else x - went_left
        return x

    def counts(self, x: int) -> np.ndarray:
        """Draws per source among the first ``x`` positions (int64, one per source)."""
        out = np.zeros(len(self.rates), dtype=np.int64)
        for source in self._paths:
            out[source] = self.count(source, x)
        return out

    def first_position_with(self, source: int, draws: int) -> int:
        """The smallest ``x`` with ``count(source, x) >= draws`` (``draws`` >= 0; the rate must be > 0)."""
        if draws <= 0:
            return 0
        if source not in self._paths:
            raise ConfigError(f"source {source} has rate 0 and is never drawn", field="weights")
        low, high = 0, max(1, int(draws / self.rates[source]) + 4)
        while self.count(source, high) < draws:
            low, high = high, high * 2
        while low < high:
            middle = (low + high) // 2
            if self.count(source, middle) >= draws:
                high = middle
            else:
                low = middle + 1
        return low

    def discrepancy(self, source: int) -> float:
        """An upper bound on ``|count(source, x) - effective_rate(source) * x|`` over every ``x`` (samples)."""
        bound = 0.0
        for node, left in self._paths.get(source, []):
            share = self._fraction[node] / _ONE
            bound = 0.5 + (share if left else 1.0 - share) * bound
        return bound

    def _effective_rate(self, source: int) -> float:
        rate = 1.0
        for node, left in self._paths.get(source, []):
            share = self._fraction[node] / _ONE
            rate *= share if left else 1.0 - share
        return rate

    def effective_rate(self, source: int) -> float:
        """The rate the fixed-point tree realises (``rates[source]`` within ~2^-22)."""
        return self._effective_rate(source) if source in self._paths else 0.0

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, draw number inside the source) of every position (int64 arrays)."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and positions.min() < 0:
            raise IndexError("negative position")
        tree = _Tree([self], len(self.rates))
        return tree.walk(positions, np.full(len(positions), tree.roots[0], dtype=np.int64))


_CHUNK = 1 << 15
_SCALAR_BELOW = 48


def _walk(
    x: np.ndarray, node: np.ndarray, fraction: np.ndarray, children: np.ndarray, depth: int
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised root -> leaf walk over a tree whose leaves are absorbing nodes (fraction 1, both
    children themselves); returns (leaf node, rank inside the leaf)."""
    x = x.astype(np.int64, copy=True)
    node = node.astype(np.int64, copy=True)
    for _ in range(depth):
        share = fraction[node]
        scaled = share * x
        before = (scaled + _HALF) >> _FRACTION_BITS
        after = (scaled + share + _HALF) >> _FRACTION_BITS
        goes_right = after == before
        x -= np.where(goes_right, before, x - before)
        node = children[2 * node + goes_right]
    return node, x


class _Tree:
    """Every node of one or more mixes in flat arrays; leaf nodes absorb (see :func:`_walk`)."""

    def __init__(self, mixes: Sequence[MixSchedule], buckets: int) -> None:
        fractions: list[int] = []
        children: list[int] = []
        leaf_source: list[int] = []
        self.roots: list[int] = []
        self.depth = 0

        def add(mix: MixSchedule, node: int, depth: int) -> int:
            me = len(fractions)
            fractions.append(_ONE)
            children.extend((me, me))
            if node < 0:
                leaf_source.append(-node - 1)
                self.depth = max(self.depth, depth)
                return me
            leaf_source.append(-1)
            fractions[me] = mix._fraction[node]
            left = add(mix, mix._left[node], depth + 1)
            right = add(mix, mix._right[node], depth + 1)
            children[2 * me], children[2 * me + 1] = left, right
            return me

        for mix in mixes:
            self.roots.append(add(mix, mix._root, 0))
        self.fraction = np.asarray(fractions, dtype=np.int64)
        self.children = np.asarray(children, dtype=np.int64)
        self.source = np.asarray(leaf_source, dtype=np.int64)
        self.root_array = np.asarray(self.roots, dtype=np.int64)

    def walk(self, x: np.ndarray, roots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        leaf, rank = _walk(x, roots, self.fraction, self.children, self.depth)
        return self.source[leaf], rank


def bucket_permutation(seed: int, bucket: int, epoch: int, size: int) -> FeistelPermutation:
    """The keyed order of one bucket epoch (the sampler's Feistel network)."""
    return FeistelPermutation(size, round_keys(_mix64(seed, 0xB0C4E7, bucket), epoch))


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
        self._permutations: dict[tuple[int, int], FeistelPermutation] = {}
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
                mix = MixSchedule(rates, key=_mix64(self.seed, 0x5E6, len(self.segments)))
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
            return sum(
                builder.tokens_of(b, builder.drawn[b] + mix.count(b, x)) - builder.tokens_of(b, builder.drawn[b])
                for b in active
            )

        low, high = 0, 1
        while spent(high) < budget:
            low, high = high, high * 2
            if high > MAX_SEGMENT:
                raise ConfigError(f"a phase segment needs more than {MAX_SEGMENT} samples", field="duration_tokens")
        while low < high:
            middle = (low + high) // 2
            if spent(middle) >= budget:
                high = middle
            else:
                low = middle + 1
        length = low
        for b in active:
            remaining = builder.capacity[b] - builder.drawn[b]
            # the first position that would need draw number `remaining` (0-based) of b
            dry = mix.first_position_with(b, remaining + 1) - 1
            length = min(length, dry)
        return length

    def _pack(self) -> None:
        self._starts = np.asarray([s.start for s in self.segments], dtype=np.int64)
        self._tree_arrays = _Tree(self._mixes, len(self.bucket_samples))
        self._start_list = self._starts.tolist()
        tree = self._tree_arrays
        self._tree_lists = (tree.fraction.tolist(), tree.children.tolist(), tree.source.tolist())
        bases = [segment.base for segment in self.segments]
        self._base = np.asarray(bases, dtype=np.int64).reshape(len(self.segments), len(self.bucket_samples))
        self._phase = np.asarray([s.phase for s in self.segments], dtype=np.int64)

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
        return phase, bucket, index

    def _locate_few(self, positions: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`locate` for a handful of positions, in Python integers (same results)."""
        count = len(positions)
        phases, buckets, indices = [0] * count, [0] * count, [0] * count
        starts, roots, tree = self._start_list, self._tree_arrays.roots, self._tree_lists
        fraction, children, source = tree
        for row, position in enumerate(positions):
            if not 0 <= position < self.num_samples:
                raise IndexError(f"positions outside [0, {self.num_samples})")
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
            draw = self.segments[k].base[b] + x
            epoch, within = divmod(draw, self.bucket_samples[b])
            phases[row], buckets[row] = self.segments[k].phase, b
            indices[row] = self._permutation(b, epoch).one(within) if self.shuffle else within
        as_array = np.asarray
        return as_array(phases, np.int64), as_array(buckets, np.int64), as_array(indices, np.int64)

    def _permutation(self, bucket: int, epoch: int) -> FeistelPermutation:
        key = (bucket, epoch)
        permutation = self._permutations.get(key)
        if permutation is None:
            if len(self._permutations) > 256:
                self._permutations.clear()
            permutation = self._permutations[key] = bucket_permutation(
                self.seed, bucket, epoch, self.bucket_samples[bucket]
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

    def segment_mix(self, index: int) -> MixSchedule:
        return self._mixes[index]
