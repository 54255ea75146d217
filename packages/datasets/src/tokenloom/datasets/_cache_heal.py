"""The tokenized Hugging Face cache heals: damage is logged and rebuilt; an unwritable cache goes private.

The cache is a native dataset whose ``manifest.json`` (written last, self-checksummed,
with every file's size and xxh3) is the completion record. On every open rank 0
checks the manifest and the file sizes (fast: no token is read); a damaged cache
is logged, moved aside, removed and rebuilt. A cache directory that cannot be
written gives a private temporary cache (removed at exit) and a warning.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

from tokenloom.formats import DataError, open_dataset

__all__ = ["heal_cache", "private_cache_dir"]

log = logging.getLogger("tokenloom.datasets")


def heal_cache(path: Path) -> bool:
    """Remove a damaged cache at ``path`` (logged); True if it was damaged."""
    if not path.exists():
        return False
    try:
        open_dataset(path, format="native", validate="fast")
        return False
    except (DataError, OSError) as exc:
        log.warning("tokenized cache %s is damaged (%s); rebuilding it", path, exc)
    aside = path.with_name(f".{path.name}-damaged-{os.getpid()}")
    with contextlib.suppress(OSError):
        os.replace(path, aside)
        shutil.rmtree(aside, ignore_errors=True)
    return True


def private_cache_dir(wanted: Path, exc: OSError) -> Path:
    """A temporary cache for this process when ``wanted`` cannot be written (warns, removed at exit)."""
    root = Path(tempfile.mkdtemp(prefix="tokenloom-hf-cache-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    log.warning(
        "cannot write the tokenized cache %s (%s); using the private temporary cache %s for this process "
        "(pass a writable cache_dir to keep it across runs)",
        wanted,
        exc,
        root,
    )
    return root / wanted.name
