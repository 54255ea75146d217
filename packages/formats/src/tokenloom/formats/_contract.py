"""What a format provides: the typed reader and writer contract and its registry entry.

A format (built in, or a third party's through the ``tokenloom.formats`` entry-point group) is one
:class:`FormatSpec`: a detector, a :class:`TokenReader`, usually a :class:`WriterFactory`, and for a
keyed store a :class:`StoreSpec`. ``validate`` reaches every reader as a :class:`Validate` member.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tokenloom.formats.errors import ConfigError

if TYPE_CHECKING:
    from tokenloom.formats._dataset import TokenDataset
    from tokenloom.formats._writer import TokenWriter
    from tokenloom.formats.keyed.store import KeyedStore

__all__ = ["FormatSpec", "StoreSpec", "TokenReader", "Validate", "WriterFactory", "as_validate"]


class Validate(StrEnum):
    """How much ``open_dataset`` checks before returning."""

    NONE = "none"  # trust the files (sizes are still read)
    FAST = "fast"  # headers, sizes, offsets, manifest (and index-file checksums)
    DEEP = "deep"  # also every checksum, token ids < vocab size, EOS placement


def as_validate(value: Validate | str) -> Validate:
    """``value`` as a :class:`Validate` member, or ConfigError listing the valid ones."""
    try:
        return Validate(value)
    except ValueError:
        raise ConfigError(
            f"validate={value!r}, expected one of {[v.value for v in Validate]}", field="validate"
        ) from None


class TokenReader(Protocol):
    """Opens one format's data at ``path``; the options a spec lists arrive as keywords."""

    def __call__(self, path: Path, /, *, validate: Validate, dtype: Any) -> TokenDataset: ...


class WriterFactory(Protocol):
    """Creates a crash-safe writer at ``path`` (a :class:`TokenWriter` subclass fits)."""

    def __call__(
        self, path: str | os.PathLike[str], /, *, dtype: Any, vocab_size: int | None, eos_id: int | None
    ) -> TokenWriter: ...


@dataclass(frozen=True, slots=True)
class StoreSpec:
    """The keyed-store side of a format: ``open_store(path, name)`` builds ``store(validate=...)``."""

    name: str  # the format users pass to open_store ("h5", "bin")
    store: Callable[..., KeyedStore]  # store(validate=..., max_elements=...) -> an unloaded store
    detect: Callable[[Path], bool]  # does the directory (searched recursively) or file hold this store?
    looks_like: str  # what detection looks for, for the error that lists what was tried


@dataclass(frozen=True, slots=True)
class FormatSpec:
    """A token format tokenloom reads (and usually writes), registered under ``name``."""

    name: str
    description: str
    detect: Callable[[Path], bool]
    open: TokenReader
    writer: WriterFactory | None = None  # writer(path, *, dtype, vocab_size, eos_id, **writer options)
    options: tuple[str, ...] = ()  # keywords ``open`` takes besides validate and dtype
    detectable: bool = True  # False: opened only by name (format=...), never chosen by detect_format
    store: StoreSpec | None = None  # keyed stores: how open_store reads all of its keys
