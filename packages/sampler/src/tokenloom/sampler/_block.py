"""``order="block"``: a keyed bijection of [0, n) that reads storage in runs, for data in object storage.

The global Feistel order sends consecutive positions anywhere in the dataset: on local disk that costs
nothing, from object storage every sample touches another block. The block order keeps the reads local
and the shuffle keyed:

    samples  -> blocks of ``block_samples`` consecutive samples (the last may be short)
    blocks   -> a keyed Feistel order of the full blocks; the short block, if any, comes last
    windows  -> ``window_blocks`` consecutive blocks of that order; the samples of window k are
                shuffled among themselves by a Feistel permutation keyed by (seed, epoch, k)

Position p lies in window ``p // (block_samples * window_blocks)``, so any position is computed directly
in O(1) time and memory: the state stays one number (samples consumed), and rank r of W still takes
positions c + r, c + r + W, ... on any world size. A reader (all ranks of a node together) needs only the
blocks of the current window: ``window_blocks`` blocks, each read once, so fetched bytes / used bytes stays
near 1 when a block of samples spans whole cache blocks.
"""

from __future__ import annotations

import numpy as np

from tokenloom.formats.errors import ConfigError
from tokenloom.sampler._feistel import FeistelPermutation, round_keys

#: 16,384 samples: 64 MiB of 2,049-token uint16 windows, eight of the remote layer's 8 MiB blocks (a block
#: of samples that spans m cache blocks touches about m + 1 of them: fetched / used ~ 1 + 1/m)
DEFAULT_BLOCK_SAMPLES = 16384
#: 8 blocks shuffled together: 131,072 samples (MosaicML streaming shuffles 262,144), 512 MiB of such windows
DEFAULT_WINDOW_BLOCKS = 8
#: the largest sizes accepted: their product (a window's samples) stays inside int64 position arithmetic
MAX_BLOCK_SAMPLES = 2**40
MAX_WINDOW_BLOCKS = 2**20
_WINDOW_SALT = 0xB10C_5A3D_0F_0DE5  # keys the windows apart from the block order of the same seed


def check_block_options(order: str, block_samples: object, window_blocks: object) -> tuple[int, int]:
    """(block_samples, window_blocks) for ``order="block"`` (defaults filled in); (0, 0) for other orders."""
    from tokenloom.sampler._config import check_int

    if order != "block":
        given = [name for name, value in (("block_samples", block_samples), ("window_blocks", window_blocks)) if value]
        if given:
            raise ConfigError(
                f"{given[0]} is set but order is {order!r}: it applies to order='block' only",
                field=given[0],
                hint="Pass order='block' (data in object storage), or drop the option",
            )
        return 0, 0
    samples = check_int(
        "block_samples", DEFAULT_BLOCK_SAMPLES if block_samples is None else block_samples, 1, MAX_BLOCK_SAMPLES
    )
    blocks = check_int(
        "window_blocks", DEFAULT_WINDOW_BLOCKS if window_blocks is None else window_blocks, 1, MAX_WINDOW_BLOCKS
    )
    return samples, blocks


class BlockOrder:
    """The block order of epoch ``epoch``: ``positions -> indices``, a bijection of [0, n)."""

    def __init__(self, n: int, *, seed: int, epoch: int, block_samples: int, window_blocks: int) -> None:
        self.n = n
        self.block_samples = block_samples
        self.window_blocks = window_blocks
        self.window_samples = block_samples * window_blocks
        self.full_blocks = n // block_samples
        self._blocks = FeistelPermutation(max(self.full_blocks, 1), round_keys(seed, epoch))
        self._window_seed = round_keys((seed ^ _WINDOW_SALT) & ((1 << 64) - 1), epoch, rounds=2)[0]
        self._windows: dict[int, FeistelPermutation] = {}

    def window_size(self, window: int) -> int:
        """Samples in window ``window`` (all but the last hold block_samples * window_blocks)."""
        return min(self.window_samples, self.n - window * self.window_samples)

    def _window(self, window: int) -> FeistelPermutation:
        found = self._windows.get(window)
        if found is None:
            if len(self._windows) > 64:
                self._windows.clear()
            found = self._windows[window] = FeistelPermutation(
                self.window_size(window), round_keys(self._window_seed, window)
            )
        return found

    def block_at(self, slots: np.ndarray) -> np.ndarray:
        """The block at each slot of the block order (the short block, if any, is the last slot)."""
        slots = np.asarray(slots, dtype=np.int64)
        full = slots < self.full_blocks
        out = slots.copy()
        if full.any():
            out[full] = self._blocks(slots[full])
        return out

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        windows = positions // self.window_samples
        inside = positions - windows * self.window_samples
        shuffled = np.empty_like(inside)
        if windows.size and windows[0] == windows[-1] and (windows == windows[0]).all():
            shuffled[:] = self._window(int(windows[0]))(inside)
        elif windows.size:  # group the rows by window once: O(n log n), not a mask per window (O(n * windows))
            rows = np.argsort(windows, kind="stable")
            grouped = windows[rows]
            edges = np.flatnonzero(grouped[1:] != grouped[:-1]) + 1
            for first, last in zip([0, *edges.tolist()], [*edges.tolist(), len(rows)], strict=True):
                picked = rows[first:last]
                shuffled[picked] = self._window(int(grouped[first]))(inside[picked])
        slots = windows * self.window_blocks + shuffled // self.block_samples
        return self.block_at(slots) * self.block_samples + shuffled % self.block_samples
