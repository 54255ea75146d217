"""The tokenized Hugging Face cache heals: damage is logged and rebuilt; an unwritable cache goes private.

The cache is a native dataset whose ``manifest.json`` (written last, self-checksummed,
with every file's size and xxh3-128) is the completion record. On every open rank 0
checks the manifest, the file sizes and, by default, every file's xxh3 against the
record (``verify_content``): a byte flipped inside a token shard is caught, not only a
truncation. The content check reads the cache once, at memory or disk speed (about
12 ms per 100 MB from the page cache, measured in the package README); pass
``verify_cache=False`` to HuggingFaceDataset to check sizes and index checksums only.
A damaged cache is logged, moved aside, removed and rebuilt. A cache directory that
cannot be written gives a private temporary cache (removed at exit) and a warning.
"""

from __future__ import annotations

import atexit
import logging
import shutil
import tempfile
from pathlib import Path

from tokenloom.datasets._plan_cache import discard
from tokenloom.formats import DataError, open_dataset, read_manifest

__all__ = ["heal_cache", "private_cache_dir"]

log = logging.getLogger("tokenloom.datasets")


def heal_cache(path: Path, *, verify_content: bool = True) -> bool:
    """Remove a damaged cache at ``path`` (logged); True if it was damaged.

    ``verify_content``: also compare every file's xxh3 with the manifest (reads the cache once).
    """
    if not path.exists():
        return False
    try:
        open_dataset(path, format="native", validate="fast")
        if verify_content:
            read_manifest(path).verify(path, deep=True)
        return False
    except (DataError, OSError) as exc:
        log.warning("tokenized cache %s is damaged (%s); rebuilding it", path, exc)
    discard(path)
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
