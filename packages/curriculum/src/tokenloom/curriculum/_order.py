"""The order of each bucket's draws: ``order`` (feistel | block, or a mapping bucket -> order) in the config.

``block`` gives a bucket the sampler's block order (:class:`tokenloom.sampler.BlockOrder`, sized by
``block_samples`` and ``window_blocks``): its draws stay in one window of blocks at a time, so a bucket in
object storage is fetched in runs. Which bucket serves each position (the mix) never depends on it.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from enum import StrEnum
from typing import TypeVar

from tokenloom.formats import ConfigError
from tokenloom.sampler import MAX_BLOCK_SAMPLES, MAX_WINDOW_BLOCKS

__all__ = ["BucketOrder", "check_order", "parse_choice", "resolve_order"]

_Choice = TypeVar("_Choice", bound=StrEnum)


class BucketOrder(StrEnum):
    """The order of a bucket's draws inside its epoch (which bucket serves a position does not change)."""

    FEISTEL = "feistel"
    """A keyed bijection of the whole bucket (the default): draws land anywhere in its data."""
    BLOCK = "block"
    """The sampler's block order: blocks of ``block_samples`` consecutive samples in a keyed order, shuffled
    inside windows of ``window_blocks`` blocks; a bucket in object storage is fetched in runs (fetched ~ used)."""


def parse_choice(
    choices: type[_Choice], value: object, name: str, where: str | None, hint: str | None = None
) -> _Choice:
    """``value`` as a member of ``choices``, or a ConfigError listing the valid names."""
    try:
        return choices(value)
    except (ValueError, TypeError):
        valid = ", ".join(member.value for member in choices)
        raise ConfigError(f"{name} is {value!r}, expected one of {valid}", path=where, field=name, hint=hint) from None


def _parse(value: object, name: str, where: str | None) -> BucketOrder:
    hint = "order: block reads buckets in object storage in runs; feistel (the default) anywhere"
    return parse_choice(BucketOrder, value, name, where, hint)


def check_order(
    order: object, block_samples: object, window_blocks: object, where: str | None = None
) -> tuple[BucketOrder | dict[str, BucketOrder], int | None, int | None]:
    """``order`` as a BucketOrder or a sorted {bucket: BucketOrder}, and the two block sizes checked."""
    if isinstance(order, Mapping):
        parsed: BucketOrder | dict[str, BucketOrder] = {}
        for bucket, value in order.items():
            if not isinstance(bucket, str) or not bucket:
                raise ConfigError(f"order has the key {bucket!r}, expected a bucket name", path=where, field="order")
            parsed[bucket] = _parse(value, f"order.{bucket}", where)
        parsed = dict(sorted(parsed.items()))
        uses_block = BucketOrder.BLOCK in parsed.values()
    else:
        parsed = _parse(order, "order", where)
        uses_block = parsed is BucketOrder.BLOCK
    sizes = []
    for name, value in (("block_samples", block_samples), ("window_blocks", window_blocks)):
        if value is None:
            sizes.append(None)
            continue
        if not uses_block:
            raise ConfigError(
                f"{name} is set but no bucket has order block",
                path=where,
                field=name,
                hint="Set order: block (for every bucket, or per bucket), or drop the option",
            )
        most = MAX_BLOCK_SAMPLES if name == "block_samples" else MAX_WINDOW_BLOCKS
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 1 <= int(value) <= most:
            raise ConfigError(
                f"{name} is {value!r}, expected an integer >= 1 and <= {most:,}",
                path=where,
                field=name,
                hint="block_samples * window_blocks samples are shuffled together: size a window to what a node "
                "may fetch ahead (the defaults: 16,384 samples, 8 a window)",
            )
        sizes.append(int(value))
    return parsed, sizes[0], sizes[1]


def resolve_order(
    order: object, block_samples: int | None, window_blocks: int | None, bucket: str
) -> tuple[int, int] | None:
    """The schedule's order of ``bucket``: None (feistel) or (block_samples, window_blocks), defaults filled in."""
    from tokenloom.sampler import DEFAULT_BLOCK_SAMPLES, DEFAULT_WINDOW_BLOCKS

    chosen = order.get(bucket, BucketOrder.FEISTEL) if isinstance(order, Mapping) else order
    if chosen is not BucketOrder.BLOCK:
        return None
    return (
        block_samples if block_samples is not None else DEFAULT_BLOCK_SAMPLES,
        window_blocks if window_blocks is not None else DEFAULT_WINDOW_BLOCKS,
    )
