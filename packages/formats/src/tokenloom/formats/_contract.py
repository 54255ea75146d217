"""What a format provides: the typed reader and writer contract and its registry entry.

A format (built in, or a third party's through the ``tokenloom.formats`` entry-point group) is one
:class:`FormatSpec`: a detector, a :class:`TokenReader`, usually a :class:`WriterFactory`, what its
output looks like on disk (the data-file suffixes, the paths a writer creates, its files' names) and,
for a keyed store, a :class:`StoreSpec`. Everything that converts, locks, uploads or names an output
asks the spec, never the format's name. ``validate`` reaches every reader as a :class:`Validate` member.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tokenloom.formats.errors import ConfigError
from tokenloom.formats.io.manifest import MANIFEST_NAME
from tokenloom.formats.io.sidecar import sidecar_of

if TYPE_CHECKING:
    from tokenloom.formats._dataset import TokenDataset
    from tokenloom.formats._writer import TokenWriter

__all__ = ["FormatSpec", "StoreSpec", "TokenReader", "Validate", "WriterFactory", "as_validate"]


class Validate(StrEnum):
    """How much ``open_dataset`` checks before returning."""

    NONE = "none"  # trust the files (sizes are still read)
    FAST = "fast"  # headers, sizes, offsets, manifest (and index-file checksums; native: index blocks on touch)
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
    store: Callable[..., Any]  # store(validate=..., max_elements=...) -> an unloaded KeyedStore
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
    suffixes: tuple[str, ...] = ()  # its data files' suffixes: read by blocks, never whole, from object storage
    targets: Callable[[Path], list[Path]] | None = None  # see write_targets; None: the usual paths
    #: None: a dataset is a directory of its own; else its name inside an output directory (a file or
    #: a Megatron prefix) among files that may belong to others
    output_name: str | None = None
    file_names: str = ""  # for a directory dataset: a regex of the names its writer creates there
    #: in object storage its manifest is the commit marker (uploaded last): files without it are not opened
    manifest_required: bool = False
    #: tokenize writes this format's shards itself, unit by unit (native); it writes any other token format by
    #: converting those shards at finalize
    unit_shards: bool = False
    dtypes: tuple[str, ...] = ()  # the token dtypes its writer stores; empty: any

    @property
    def owns_directory(self) -> bool:
        """Is a dataset of this format a whole directory (not named files in a shared one)?"""
        return self.output_name is None

    def write_targets(self, target: str | os.PathLike[str]) -> list[Path]:
        """Every path a writer at ``target`` may create or replace: the first is locked while it converts, the
        last uploaded last (a reader of a bucket finds the dataset once it is there). Unless ``targets`` says
        otherwise: the directory and its manifest, or the file and its sidecar (EOS id, vocab size)."""
        path = Path(target)
        if self.targets is not None:
            return self.targets(path)
        return [path, path / MANIFEST_NAME] if self.output_name is None else [path, sidecar_of(path)]

    def output_path(self, directory: str | os.PathLike[str]) -> Path:
        """Where a dataset of this format goes when written into ``directory`` (what its writer is given)."""
        return Path(directory) if self.output_name is None else Path(directory, self.output_name)

    def owns_file(self, name: str) -> bool:
        """Is ``name``, a file in an output directory, one that a writer of this format puts there?"""
        if self.output_name is None:
            return bool(self.file_names) and re.fullmatch(self.file_names, name) is not None
        return name in {path.name for path in self.write_targets(self.output_name)}
