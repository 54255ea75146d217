"""A keyed bijection of [0, n): a Feistel network with cycle-walking.

Why: shuffling N = 10^10 sample indices with ``randperm`` needs 80 GB and
minutes; a keyed permutation answers "which index sits at position p?" in O(1)
time and memory, so any rank can start anywhere in the epoch order without
materialising it.

The network works on ``bits`` = bit length of ``n - 1`` (at least 2), split into
a left and a right half of possibly unequal width; each round maps
``(L, R) -> (R, L xor F(R))`` and the widths swap, so an even number of rounds
is a bijection of [0, 2**bits). Cycle-walking (re-applying the network until
the value falls below ``n``) restricts it to [0, n); since 2**bits < 2n, on
average fewer than two passes are needed. The round function is murmur3's
64-bit finaliser over ``R + round_key``; round keys come from splitmix64 keyed
by (seed, epoch) alone, so the order is the same on every machine, process and
thread count.
"""

from __future__ import annotations

import numpy as np

__all__ = ["FeistelPermutation", "round_keys"]

_MASK64 = (1 << 64) - 1
_ROUNDS = 6
_FMIX_C1 = np.uint64(0xFF51AFD7ED558CCD)
_FMIX_C2 = np.uint64(0xC4CEB9FE1A85EC53)
_SHIFT33 = np.uint64(33)


def _splitmix64(state: int) -> tuple[int, int]:
    """One splitmix64 step on Python ints: (next state, output)."""
    state = (state + 0x9E3779B97F4A7C15) & _MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return state, z ^ (z >> 31)


def round_keys(seed: int, epoch: int, rounds: int = _ROUNDS) -> tuple[int, ...]:
    """Counter-based round keys for (seed, epoch): no global RNG, no hash seed."""
    state, _ = _splitmix64(seed & _MASK64)
    state ^= epoch & _MASK64
    keys = []
    for _ in range(rounds):
        state, key = _splitmix64(state)
        keys.append(key)
    return tuple(keys)


def _fmix64(values: np.ndarray) -> np.ndarray:
    """murmur3 finaliser, in place on a uint64 array (wrapping multiplication)."""
    values ^= values >> _SHIFT33
    values *= _FMIX_C1
    values ^= values >> _SHIFT33
    values *= _FMIX_C2
    values ^= values >> _SHIFT33
    return values


class FeistelPermutation:
    """The bijection ``position -> index`` of [0, n) for one key; O(1) memory."""

    __slots__ = ("_bits", "_int_keys", "_keys", "_left_bits", "_n")

    def __init__(self, n: int, keys: tuple[int, ...]) -> None:
        if len(keys) % 2:
            raise ValueError(f"a Feistel network needs an even number of round keys, got {len(keys)}")
        self._n = n
        self._bits = max(2, (n - 1).bit_length())
        self._left_bits = self._bits // 2
        self._keys = tuple(np.uint64(k) for k in keys)
        self._int_keys = tuple(int(k) & _MASK64 for k in keys)

    def _network(self, values: np.ndarray) -> np.ndarray:
        """One pass of every round over [0, 2**bits), uint64 in and out."""
        left_bits, right_bits = self._left_bits, self._bits - self._left_bits
        for key in self._keys:
            right_mask = np.uint64((1 << right_bits) - 1)
            left = values >> np.uint64(right_bits)
            right = values & right_mask
            mixed = _fmix64(right + key)
            mixed &= np.uint64((1 << left_bits) - 1)
            left ^= mixed
            right <<= np.uint64(left_bits)
            values = right | left
            left_bits, right_bits = right_bits, left_bits
        return values

    def one(self, position: int) -> int:
        """The index at one position, in plain Python integers (faster than numpy below ~32 values)."""
        mask64 = _MASK64
        bits, n = self._bits, self._n
        first_left = self._left_bits
        value = position
        while True:
            left_bits, right_bits = first_left, bits - first_left
            for key in self._int_keys:
                right = value & ((1 << right_bits) - 1)
                mixed = (right + key) & mask64
                mixed ^= mixed >> 33
                mixed = (mixed * 0xFF51AFD7ED558CCD) & mask64
                mixed ^= mixed >> 33
                mixed = (mixed * 0xC4CEB9FE1A85EC53) & mask64
                mixed ^= mixed >> 33
                value = (right << left_bits) | ((value >> right_bits) ^ (mixed & ((1 << left_bits) - 1)))
                left_bits, right_bits = right_bits, left_bits
            if value < n:
                return value

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """Indices at ``positions`` (int64 in [0, n)), as an int64 array."""
        values = self._network(positions.astype(np.uint64))
        limit = np.uint64(self._n)
        walking = np.flatnonzero(values >= limit)
        while walking.size:
            stepped = self._network(values[walking])
            values[walking] = stepped
            walking = walking[stepped >= limit]
        return values.astype(np.int64)
