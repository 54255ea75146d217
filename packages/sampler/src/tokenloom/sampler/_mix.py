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
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

import numpy as np

from tokenloom.formats.errors import ConfigError
from tokenloom.sampler._feistel import _MASK64, _splitmix64

__all__ = ["MAX_SEGMENT", "MixSchedule", "Tree", "mix64"]

_FRACTION_BITS = 22
_ONE = 1 << _FRACTION_BITS
_HALF = 1 << (_FRACTION_BITS - 1)
_SEARCH_LIMIT = 8
MAX_SEGMENT = 1 << 40
"""Positions inside one segment stay below this, so ``p * x`` fits in int64."""


def mix64(*values: int) -> int:
    """splitmix64 over a tuple of ints: a counter-based hash, no generator object."""
    state = 0x243F6A8885A308D3
    for value in values:
        _, state = _splitmix64(state ^ (value & _MASK64))
    return state


def first_reaching(value: Callable[[int], int], target: int, high: int) -> int:
    """The smallest ``x >= 0`` with ``value(x) >= target`` for a non-decreasing ``value`` (gallop, then bisect)."""
    low = 0
    while value(high) < target:
        low, high = high, high * 2
    return low + bisect.bisect_left(range(low, high), target, key=value)


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
        if mix64(key, node) & 1:
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
        return first_reaching(lambda x: self.count(source, x), draws, max(1, int(draws / self.rates[source]) + 4))

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
        tree = Tree([self], len(self.rates))
        return tree.walk(positions, np.full(len(positions), tree.roots[0], dtype=np.int64))


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


class Tree:
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
