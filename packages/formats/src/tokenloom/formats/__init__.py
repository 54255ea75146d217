"""tokenloom.formats: token data on disk, read and written safely.

    raw shards (native .bin/.idx, flat .npy/.bin, Megatron, Modalities .pbin, keyed stores)
        -> open_dataset(path) -> TokenDataset (zero-copy views over memory maps)

This package also owns what every tokenloom package shares: the error hierarchy
(:mod:`tokenloom.formats.errors`) and the ``tokenloom`` command.
"""

from tokenloom.formats._optional import require
from tokenloom.formats.errors import (
    ChecksumError,
    ConfigError,
    DataError,
    FormatError,
    IndexCorruptError,
    MissingFileError,
    MissingKeyError,
    RecordError,
    ResourceLimitError,
    ResumeMismatchError,
    ShapeMismatchError,
    TokenRangeError,
    TruncatedError,
    UnsafeFormatError,
    UnsafePathError,
)

__all__ = [
    "ChecksumError",
    "ConfigError",
    "DataError",
    "FormatError",
    "IndexCorruptError",
    "MissingFileError",
    "MissingKeyError",
    "RecordError",
    "ResourceLimitError",
    "ResumeMismatchError",
    "ShapeMismatchError",
    "TokenRangeError",
    "TruncatedError",
    "UnsafeFormatError",
    "UnsafePathError",
    "require",
]
