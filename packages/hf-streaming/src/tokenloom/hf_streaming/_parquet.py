"""Parquet files of a stream's sources: local, or over ranged reads (the footer once per process, then row groups)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tokenloom.formats import RemoteOptions
from tokenloom.hf_streaming._remote import RangeReader

if TYPE_CHECKING:
    from tokenloom.hf_streaming._units import Source

__all__ = ["parquet_file"]


def parquet_file(source: Source) -> Any:
    """A ``pyarrow.parquet.ParquetFile``: local, or over ranged reads (footer first, then row groups by range)."""
    import pyarrow.parquet as pq

    if source.remote is None:
        return pq.ParquetFile(source.path)
    key = (source.remote.url, source.remote.etag)
    metadata = _FOOTERS.get(key)
    parquet = pq.ParquetFile(
        RangeReader(source.remote, source.access or RemoteOptions()), metadata=metadata, pre_buffer=True
    )
    if metadata is None:
        if len(_FOOTERS) >= 256:
            _FOOTERS.pop(next(iter(_FOOTERS)))
        _FOOTERS[key] = parquet.metadata
    return parquet


_FOOTERS: dict[tuple[str, str], Any] = {}
"""Parquet footers already read in this process, by (URL, ETag): a row group then costs one ranged GET."""
