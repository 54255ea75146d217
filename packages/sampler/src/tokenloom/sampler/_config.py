"""Input checks that raise ConfigError naming the value and the valid range (never assert)."""

from __future__ import annotations

import operator
from collections.abc import Sized
from enum import StrEnum
from typing import TypeVar

from tokenloom.formats.errors import ConfigError

__all__ = ["check_choice", "check_int", "dataset_length", "world"]

_Choice = TypeVar("_Choice", bound=StrEnum)

MAX_LENGTH = 2**62
"""Positions are int64; this leaves room for padding past the end."""


def check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    """``value`` as an int in [low, high] (high None: no upper bound); bools are refused."""
    valid = f"[{low}, {high}]" if high is not None else f">= {low}"
    if isinstance(value, bool):
        raise ConfigError(f"{name} is {value!r}, expected an integer {valid}", field=name)
    try:
        number = operator.index(value)  # pyright: ignore[reportArgumentType]
    except TypeError:
        raise ConfigError(
            f"{name} is {value!r} ({type(value).__name__}), expected an integer {valid}", field=name
        ) from None
    if number < low or (high is not None and number > high):
        raise ConfigError(f"{name} is {number}, expected an integer {valid}", field=name)
    return number


def check_choice(name: str, value: object, choices: type[_Choice]) -> _Choice:
    """``value`` as a member of ``choices``, or an error listing every valid name."""
    try:
        return choices(value)
    except ValueError:
        valid = ", ".join(repr(member.value) for member in choices)
        raise ConfigError(f"{name} is {value!r}, expected one of {valid}", field=name) from None


def dataset_length(dataset_or_length: object) -> int:
    """N from an int or from anything with ``__len__`` (a map-style dataset)."""
    if isinstance(dataset_or_length, Sized) and not isinstance(dataset_or_length, int | str | bytes):
        return check_int("len(dataset)", len(dataset_or_length), 0, MAX_LENGTH)
    if isinstance(dataset_or_length, int) and not isinstance(dataset_or_length, bool):
        return check_int("dataset_or_length", dataset_or_length, 0, MAX_LENGTH)
    raise ConfigError(
        f"dataset_or_length is {type(dataset_or_length).__name__}, expected a dataset with "
        f"__len__ or an integer in [0, {MAX_LENGTH}]",
        field="dataset_or_length",
    )


def world(num_replicas: object, rank: object) -> tuple[int, int]:
    """(num_replicas, rank): given values, else torch.distributed's when initialised, else (1, 0)."""
    import torch.distributed as dist

    initialised = dist.is_available() and dist.is_initialized()
    if num_replicas is None:
        num_replicas = dist.get_world_size() if initialised else 1
    replicas = check_int("num_replicas", num_replicas, 1)
    if rank is None:
        rank = dist.get_rank() if initialised else 0
    return replicas, check_int("rank", rank, 0, replicas - 1)
