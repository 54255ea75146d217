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

import threading

import numpy as np

__all__ = ["FeistelPermutation", "round_keys"]

_MASK64 = (1 << 64) - 1
_ROUNDS = 6
# uint64 constants as 0-d arrays: numpy converts a numpy scalar operand on every call, ~0.5 us each
_FMIX_C1 = np.array(0xFF51AFD7ED558CCD, dtype=np.uint64)
_FMIX_C2 = np.array(0xC4CEB9FE1A85EC53, dtype=np.uint64)
_SHIFT33 = np.array(33, dtype=np.uint64)


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


_BLOCK = 16384  # values per pass of the network: its four arrays (512 KiB) stay in a core's L2 cache
_SCALAR_TAIL = 8  # cycle-walk this few values in Python ints: cheaper than ~70 numpy calls per pass


def _uint64(value: int) -> np.ndarray:
    return np.array(value, dtype=np.uint64)


class _Scratch(threading.local):
    """Work arrays of _BLOCK values, one set per thread: no pass of the network allocates.

    A fresh array costs a page fault per 4 KiB touched (several microseconds each on some virtual
    machines); the network's temporaries used to cost more than its arithmetic. Per thread, because
    numpy releases the GIL inside a pass and one permutation may be shared by threads.
    """

    def __init__(self) -> None:
        self.left = np.empty(_BLOCK, dtype=np.uint64)
        self.right = np.empty(_BLOCK, dtype=np.uint64)
        self.mixed = np.empty(_BLOCK, dtype=np.uint64)
        self.gathered = np.empty(_BLOCK, dtype=np.uint64)


_SCRATCH = _Scratch()


def _fmix64(values: np.ndarray, shifted: np.ndarray) -> None:
    """murmur3 finaliser, in place on a uint64 array (wrapping multiplication); ``shifted`` is scratch."""
    for constant in (_FMIX_C1, _FMIX_C2):
        np.right_shift(values, _SHIFT33, out=shifted)
        np.bitwise_xor(values, shifted, out=values)
        np.multiply(values, constant, out=values)
    np.right_shift(values, _SHIFT33, out=shifted)
    np.bitwise_xor(values, shifted, out=values)


class FeistelPermutation:
    """The bijection ``position -> index`` of [0, n) for one key; O(1) memory."""

    __slots__ = ("_bits", "_int_keys", "_left_bits", "_limit", "_n", "_rounds", "_split_mask", "_split_shift")

    def __init__(self, n: int, keys: tuple[int, ...]) -> None:
        if len(keys) % 2:
            raise ValueError(f"a Feistel network needs an even number of round keys, got {len(keys)}")
        self._n = n
        self._bits = max(2, (n - 1).bit_length())
        self._left_bits = self._bits // 2
        self._int_keys = tuple(int(k) & _MASK64 for k in keys)
        right_bits = self._bits - self._left_bits
        self._split_shift = _uint64(right_bits)
        self._split_mask = _uint64((1 << right_bits) - 1)
        self._limit = _uint64(n)
        # per round: the key, and the mask of the half that round changes (the widths alternate)
        widths = (self._left_bits, right_bits)
        self._rounds = tuple((_uint64(key), _uint64((1 << widths[i % 2]) - 1)) for i, key in enumerate(self._int_keys))

    def _network(self, values: np.ndarray) -> None:
        """One pass of every round over [0, 2**bits), in place on a uint64 array of at most _BLOCK values.

        The halves live in their own arrays: ``(L, R) -> (R, L xor F(R))`` updates L in place and
        swaps the names, so after the even number of rounds L and R are back in their arrays.
        """
        size, scratch = len(values), _SCRATCH
        left, right, mixed = scratch.left[:size], scratch.right[:size], scratch.mixed[:size]
        np.right_shift(values, self._split_shift, out=left)
        np.bitwise_and(values, self._split_mask, out=right)
        for key, left_mask in self._rounds:
            np.add(right, key, out=mixed)
            _fmix64(mixed, values)  # values is free until the halves are joined again
            np.bitwise_and(mixed, left_mask, out=mixed)
            np.bitwise_xor(left, mixed, out=left)
            left, right = right, left
        np.left_shift(left, self._split_shift, out=values)
        np.bitwise_or(values, right, out=values)

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
        """Indices at ``positions`` (integers in [0, n), any shape), as an int64 array of that shape."""
        positions = np.asarray(positions)
        values = np.empty(positions.shape, dtype=np.uint64)
        np.copyto(values, positions, casting="unsafe")  # as astype(np.uint64)
        flat = values.reshape(-1)
        if flat.size and flat.max() >= self._limit:  # negatives too: they wrap to 2**64 - k
            raise IndexError(f"positions outside [0, {self._n}) of this permutation")
        # a few values go straight to one(): the whole network and its walk in Python ints
        self._walk(flat, np.arange(flat.size) if flat.size <= _SCALAR_TAIL else self._first_pass(flat))
        return values.view(np.int64)

    def _first_pass(self, flat: np.ndarray) -> np.ndarray:
        """One network pass over every value, in place; where the values that must walk on are."""
        walking = []
        for first in range(0, flat.size, _BLOCK):
            block = flat[first : first + _BLOCK]
            self._network(block)
            beyond = np.flatnonzero(block >= self._limit)
            if beyond.size:
                walking.append(beyond + first)
        return np.concatenate(walking) if walking else np.empty(0, dtype=np.intp)

    def _walk(self, flat: np.ndarray, walking: np.ndarray) -> None:
        """Cycle-walk ``flat[walking]`` until every value falls below n, in place."""
        gathered = _SCRATCH.gathered
        while walking.size > _SCALAR_TAIL:
            still = []
            for first in range(0, walking.size, _BLOCK):
                where = walking[first : first + _BLOCK]
                block = gathered[: where.size]
                np.take(flat, where, out=block)
                self._network(block)
                flat[where] = block
                still.append(where[block >= self._limit])
            walking = np.concatenate(still)
        for where in walking.tolist():
            flat[where] = self.one(int(flat[where]))
