"""``convert SRC s3://bucket/prefix``: convert into a local staging directory, then upload it, manifest last.

    source -> convert_dataset into CACHE/uploads/<URL>/<key>/out (a ``.converted`` marker when done)
           -> every data file put (skipped when the object already holds its size and checksum)
           -> the last of the format's targets (``FormatSpec.write_targets``: manifest.json, a sidecar) last

The staging key is the source's identity (its path and fingerprint) and every option that changes the
output, so a rerun after a kill reuses a finished conversion and uploads only what is missing. A target
whose manifest (or sidecar) already exists is refused unless ``overwrite``, which first deletes that
manifest; a target overlapping the source is always refused.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tokenloom.formats.errors import ConfigError
from tokenloom.formats.io.urls import RemoteURL
from tokenloom.formats.remote.publish import RemoteTarget, check_apart, staging_dir, writable_url

if TYPE_CHECKING:
    from tokenloom.formats._contract import FormatSpec
    from tokenloom.formats.remote.options import RemoteOptions

__all__ = ["convert_to_url"]

_DONE = ".converted"


def _layout(url: RemoteURL, spec: FormatSpec) -> tuple[RemoteURL, str, str]:
    """(the prefix the files go under, the local target's name, the name uploaded last)."""
    if spec.owns_directory:
        return url, "dataset", spec.write_targets("dataset")[-1].name
    parent, _, base = url.prefix.rpartition("/")
    targets = spec.write_targets(base)
    return RemoteURL(url.scheme, url.bucket, parent), targets[0].name, targets[-1].name


def convert_to_url(
    dataset: Any,
    source: object,
    target: str | os.PathLike[str],
    *,
    spec: FormatSpec,
    remote: RemoteOptions | None,
    plan_cache_dir: str | os.PathLike[str] | None,
    options: dict[str, Any],
    convert: Callable[..., Any],
    resumed: Any,
) -> Any:
    """Convert ``dataset`` into a staging directory in the format of ``spec``, then publish it.

    ``convert(dataset, local_target, to=..., **options)`` is the local conversion (``convert_dataset``,
    passed in so that this module does not import it back); ``resumed`` is the result reported when a
    rerun finds the conversion already done and only the upload left.
    """

    url = writable_url(target, "conversion target")
    check_apart(url, [source, getattr(dataset, "root", None)], "the conversion target")
    writer_options = dict(options.get("writer_options") or {})
    overwrite = bool(writer_options.pop("overwrite", False))
    to = spec.name
    prefix, local_name, last = _layout(url, spec)
    store = RemoteTarget(prefix, remote)
    existing = store.existing()
    if last in existing:
        if not overwrite:
            raise ConfigError(
                f"{url} already holds a dataset ({prefix.url(last)} exists)",
                path=str(url),
                field="target",
                hint="Pass --overwrite to replace it, or choose another target",
            )
        store.delete(last)  # first: from here on no reader sees a dataset there
    if spec.owns_directory:
        foreign = [name for name in existing if not spec.owns_file(name)]
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
    staging = staging_dir(url, key, plan_cache_dir)
    local_root = staging / "out"
    if not (staging / _DONE).exists():
        shutil.rmtree(staging, ignore_errors=True)
        local_root.mkdir(parents=True)
        result = convert(dataset, local_root / local_name, to=to, **{**options, "writer_options": writer_options})
        (staging / _DONE).touch()
    else:  # a rerun after a kill during the upload: the conversion is done
        result = resumed
    files_root = local_root / local_name if spec.owns_directory else local_root
    names = sorted(path.name for path in files_root.iterdir() if path.is_file())
    for name in names:
        if name != last:
            store.upload(files_root / name)
    if spec.owns_directory:
        store.remove_stale(names, lambda name: spec.owns_file(name) and name != last)
    store.upload(files_root / last)  # last: now the dataset exists at the URL
    shutil.rmtree(staging, ignore_errors=True)
    return result
