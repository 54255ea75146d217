"""Where an input is read from: its own path, or, for an object-store input, a copy fetched at first read."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenloom.tokenize._inputs import InputFile

__all__ = ["local_path"]


def local_path(info: InputFile) -> Path:
    """The local file to read for ``info``: its path; an object-store input is fetched there first (once)."""
    if info.url is None or info.path.is_file():
        return info.path
    from tokenloom.formats.remote import helper

    config, obj = info.remote
    info.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = info.path.with_name(f".{info.path.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp")
    try:
        with open(tmp, "wb") as out:
            for start in range(0, info.size, _FETCH_BYTES):
                end = min(info.size, start + _FETCH_BYTES)
                part = tmp.with_name(tmp.name + ".part")
                helper.fetch_into(config, obj, start, end, part)  # If-Match the listed ETag
                with open(part, "rb") as piece:
                    out.write(piece.read())
                part.unlink()
        os.replace(tmp, info.path)
    finally:
        tmp.unlink(missing_ok=True)
    return info.path


#: an object-store input is fetched in ranges of this many bytes (the helper holds one range in memory)
_FETCH_BYTES = 64 << 20
