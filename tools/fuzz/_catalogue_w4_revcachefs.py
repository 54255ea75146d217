"""Catalogue rows from the review of issue #35 items 4 and 6: a dangling link inside the cache directory."""

from __future__ import annotations

from pathlib import Path

from _catalogue_base import Run, case
from _catalogue_w4_cachefs import _close, _names, _read_all, _served


@case(
    "remote cache: a dangling symlink inside cache_dir (v1 -> a scratch disk that is gone)",
    "faults",
    "error",
    "ConfigError",
)
def _(tmp: Path) -> Run:
    server, url, source = _served(tmp)
    cache = tmp / "cache"
    cache.mkdir()
    (cache / "v1").symlink_to(tmp / "scratch-gone")
    return Run(
        call=lambda: _read_all(url, cache), check=_names(cache), cleanup=lambda: _close(server), sources=[source]
    )
