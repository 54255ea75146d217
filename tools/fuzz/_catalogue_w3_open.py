"""Catalogue rows for issue #23 item 7: indices mapped and derived once (the index cache) must never hide a change."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from _catalogue_base import Outcome, Run, case, copy


@contextlib.contextmanager
def _cache(directory: Path) -> Iterator[None]:
    """The index cache in ``directory``, and files cached however recently they changed (restored after)."""
    from tokenloom.formats.io import index_map

    saved_env, saved_settle = os.environ.get("TOKENLOOM_CACHE_DIR"), index_map._SETTLE_NS
    os.environ["TOKENLOOM_CACHE_DIR"] = str(directory)
    index_map._SETTLE_NS = 0
    try:
        yield
    finally:
        index_map._SETTLE_NS = saved_settle
        if saved_env is None:
            os.environ.pop("TOKENLOOM_CACHE_DIR", None)
        else:
            os.environ["TOKENLOOM_CACHE_DIR"] = saved_env


def _open_in(directory: Path, path: Path):
    from tokenloom.formats import open_dataset

    with _cache(directory):
        return open_dataset(path)


@case("megatron: a pointer edited after the offsets were derived and cached", "bad input", "error", "IndexCorruptError")
def _(tmp: Path) -> Run:
    prefix = copy("megatron", tmp)  # a directory holding the prefix data
    idx = prefix / "data.idx"
    _open_in(tmp / "cache", prefix)  # derives and caches the offsets
    time.sleep(0.05)
    raw = bytearray(idx.read_bytes())
    count = int(np.frombuffer(bytes(raw[18:26]), "<u8")[0])
    raw[34 + 4 * count + 8 : 34 + 4 * count + 16] = np.array([2], "<i8").tobytes()  # the second pointer
    idx.write_bytes(bytes(raw))
    return Run(call=lambda: _open_in(tmp / "cache", prefix))


@case("native: an offset edited after the scan was remembered", "bad input", "error", "IndexCorruptError")
def _(tmp: Path) -> Run:
    root = copy("gpt-simple", tmp)  # no manifest: only the remembered scan stands between the edit and a read
    _open_in(tmp / "cache", root)
    time.sleep(0.05)
    idx = sorted(root.glob("*.idx"))[0]
    raw = bytearray(idx.read_bytes())
    raw[16 + 8 : 16 + 16] = np.array([10**6], "<i8").tobytes()
    idx.write_bytes(bytes(raw))
    return Run(call=lambda: _open_in(tmp / "cache", root))


@case("index cache directory is a file (not writable)", "caches", "ok")
def _(tmp: Path) -> Run:
    blocked = tmp / "cache-is-a-file"
    blocked.write_text("x")
    prefix = copy("megatron", tmp)

    def check(outcome: Outcome) -> str | None:
        return None if outcome.value is not None and len(outcome.value) > 0 else "nothing was opened"

    return Run(call=lambda: _open_in(blocked, prefix), check=check)
