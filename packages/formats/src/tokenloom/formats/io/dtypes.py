"""The token dtypes tokenloom stores, and the code tables of the formats that name them."""

from __future__ import annotations

import os

import numpy as np

from tokenloom.formats.errors import ConfigError, TruncatedError

__all__ = ["TOKEN_DTYPES", "as_token_dtype", "check_asked_dtype", "smallest_dtype_for_vocab", "token_count"]

#: dtypes allowed for token ids, by name.
TOKEN_DTYPES: dict[str, np.dtype] = {
    name: np.dtype(name).newbyteorder("<") for name in ("uint8", "uint16", "uint32", "int32", "int64")
}


def as_token_dtype(value: object, *, field: str = "dtype") -> np.dtype:
    """Normalise ``value`` (a name, numpy dtype or type) to a little-endian token dtype."""
    if isinstance(value, str) and value in TOKEN_DTYPES:  # a name: the table's entry (np.dtype(name) is slow)
        return TOKEN_DTYPES[value]
    try:
        dtype = np.dtype(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, SyntaxError) as exc:  # np.dtype(",u2") raises SyntaxError
        raise ConfigError(f"{value!r} is not a dtype, expected one of {sorted(TOKEN_DTYPES)}", field=field) from exc
    if dtype.name not in TOKEN_DTYPES:
        raise ConfigError(
            f"dtype {dtype.name!r} cannot hold token ids, expected one of {sorted(TOKEN_DTYPES)}",
            field=field,
        )
    return TOKEN_DTYPES[dtype.name]


def check_asked_dtype(asked: object, found: np.dtype, *, recorded: str, path: str | os.PathLike[str]) -> None:
    """ConfigError when a reader was asked for dtype ``asked`` (None: any) and the data holds ``found``;
    ``recorded`` says what records it ("the manifest records")."""
    if asked is not None and (wanted := as_token_dtype(asked)) != found:
        raise ConfigError(f"dtype {wanted.name} was asked for, {recorded} {found.name}", path=path, field="dtype")


def token_count(size: int, dtype: np.dtype, *, path: str | os.PathLike[str], what: str, hint: str | None = None) -> int:
    """The tokens of ``dtype`` in ``size`` bytes of ``what`` (a data file), or TruncatedError for a partial token."""
    if size % dtype.itemsize:
        raise TruncatedError(
            f"{what} has {size} bytes, not a multiple of the {dtype.name} item size {dtype.itemsize}",
            path=path,
            hint=hint,
        )
    return size // dtype.itemsize


def smallest_dtype_for_vocab(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65,536), otherwise uint32."""
    if vocab_size < 1:
        raise ConfigError(f"vocab_size is {vocab_size}, expected >= 1", field="vocab_size")
    if vocab_size <= 1 << 16:
        return TOKEN_DTYPES["uint16"]
    if vocab_size <= 1 << 32:
        return TOKEN_DTYPES["uint32"]
    return TOKEN_DTYPES["int64"]
