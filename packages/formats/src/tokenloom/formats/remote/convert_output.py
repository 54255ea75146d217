"""``convert SRC s3://bucket/prefix``: convert into a local staging directory, then upload it, manifest last.

    source -> convert_dataset into CACHE/uploads/<URL>/<key>/out (a ``.converted`` marker when done)
           -> every data file put (skipped when the object already holds its size and checksum)
           -> manifest.json (native, flat) or NAME.tokenloom.json (megatron, packed) last

The staging key is the source's identity (its path and fingerprint) and every option that changes the
output, so a rerun after a kill reuses a finished conversion and uploads only what is missing. A target
whose manifest (or sidecar) already exists is refused unless ``overwrite``, which first deletes that
manifest; a target overlapping the source is always refused.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from typing import Any

from tokenloom.formats.errors import ConfigError
from tokenloom.formats.io.manifest import MANIFEST_NAME
from tokenloom.formats.io.urls import RemoteURL
from tokenloom.formats.remote.publish import RemoteTarget, check_apart, staging_dir, writable_url

__all__ = ["convert_to_url"]

_DIRECTORY_FORMATS = ("native", "flat")
_DONE = ".converted"
_OURS = re.compile(r"manifest\.json|shard_\d+\.(bin|idx|npy)|document_lengths\.i64")


def _layout(url: RemoteURL, to: str) -> tuple[RemoteURL, str, str]:
    """(the prefix the files go under, the local target's name, the name uploaded last)."""
    if to in _DIRECTORY_FORMATS:
        return url, "dataset", MANIFEST_NAME
    parent, _, base = url.prefix.rpartition("/")
    if to == "megatron" and base.endswith((".bin", ".idx")):
        base = base[:-4]
    return RemoteURL(url.scheme, url.bucket, parent), base, f"{base}.tokenloom.json"


def convert_to_url(
    dataset: Any,
    source: object,
    target: str | os.PathLike[str],
    *,
    to: str,
    storage_options: dict[str, Any] | None,
    cache_dir: str | os.PathLike[str] | None,
    options: dict[str, Any],
    convert: Callable[..., Any],
    resumed: Any,
) -> Any:
    """Convert ``dataset`` into a staging directory, then publish it.

    ``convert(dataset, local_target, to=..., **options)`` is the local conversion (``convert_dataset``,
    passed in so that this module does not import it back); ``resumed`` is the result reported when a
    rerun finds the conversion already done and only the upload left.
    """

    url = writable_url(target, "conversion target")
    check_apart(url, [source, getattr(dataset, "root", None)], "the conversion target")
    writer_options = dict(options.get("writer_options") or {})
    overwrite = bool(writer_options.pop("overwrite", False))
    prefix, local_name, last = _layout(url, to)
    remote = RemoteTarget(prefix, storage_options)
    existing = remote.existing()
    if last in existing:
        if not overwrite:
            raise ConfigError(
                f"{url} already holds a dataset ({prefix.url(last)} exists)",
                path=str(url),
                field="target",
                hint="Pass --overwrite to replace it, or choose another target",
            )
        remote.delete(last)  # first: from here on no reader sees a dataset there
    if to in _DIRECTORY_FORMATS:
        foreign = [name for name in existing if not _OURS.fullmatch(name)]
        if foreign:
            raise ConfigError(
                f"{url} holds objects that are not a dataset ({', '.join(foreign[:5])})",
                path=str(url),
                field="target",
                hint="Choose an empty prefix for the converted dataset",
            )
    key = {
        "source": str(getattr(dataset, "root", source)),
        "fingerprint": getattr(dataset, "fingerprint", None),
        "to": to,
        "options": {k: repr(v) for k, v in sorted(options.items()) if k not in ("on_progress", "writer_options")},
        "writer_options": {k: repr(v) for k, v in sorted(writer_options.items())},
    }
    staging = staging_dir(url, key, cache_dir)
    local_root = staging / "out"
    if not (staging / _DONE).exists():
        shutil.rmtree(staging, ignore_errors=True)
        local_root.mkdir(parents=True)
        result = convert(dataset, local_root / local_name, to=to, **{**options, "writer_options": writer_options})
        (staging / _DONE).touch()
    else:  # a rerun after a kill during the upload: the conversion is done
        result = resumed
    files_root = local_root / local_name if to in _DIRECTORY_FORMATS else local_root
    names = sorted(path.name for path in files_root.iterdir() if path.is_file())
    for name in names:
        if name != last:
            remote.upload(files_root / name)
    if to in _DIRECTORY_FORMATS:
        remote.remove_stale(names, lambda name: _OURS.fullmatch(name) is not None and name != MANIFEST_NAME)
    remote.upload(files_root / last)  # last: now the dataset exists at the URL
    shutil.rmtree(staging, ignore_errors=True)
    return result
