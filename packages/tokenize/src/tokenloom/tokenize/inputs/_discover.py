"""Input discovery: the files of ``--input-dir`` (recursively, by a registered reader's suffix), local or in
object storage.

Inputs in object storage: ``tokenize --input-dir s3://bucket/raw`` (also gs://, az://).

    discover_remote_inputs(URL)
        -> one LIST of the prefix: every object with an input suffix, its size and ETag (no download)
        -> InputFile(path=CACHE/inputs/<hash of URL>/<hash of ETag>/<relative>, url=..., etag=...)
    local_path(file), at the first read of the file (plan cuts, engine probe, chunks):
        -> fetched whole with If-Match on the listed ETag, in ranges of 64 MiB, into a temp file
           renamed into place: a node fetches only the files its units read, each once

The run key records each input's relative path, size and ETag (not a local mtime), so every node of a
run agrees on the plan, and an object replaced between the plan and a rerun is a ResumeMismatchError
naming it. The staged copy is keyed by the ETag, so a stale copy is never read for a changed object;
losing the staging directory costs a download, never data.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash

from tokenloom.formats import ConfigError, MissingFileError, UnsafePathError
from tokenloom.formats.io import storage_error
from tokenloom.formats.io.urls import parse_url
from tokenloom.tokenize.inputs._files import InputFile
from tokenloom.tokenize.inputs._registry import input_suffixes, sniff

if TYPE_CHECKING:
    from tokenloom.formats.remote.options import RemoteOptions

__all__ = ["discover_inputs", "discover_remote_inputs", "input_staging_dir"]


def _listed() -> str:
    return ", ".join(input_suffixes())


def _hash_file(path: Path) -> str:
    digest = xxhash.xxh3_128()
    with open(path, "rb") as handle:
        while block := handle.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()


def _regular_input(path: Path) -> Path:
    """``path`` if it is a readable regular file; otherwise a named error (never a silent skip)."""
    try:
        info = path.stat()
    except OSError as exc:
        raise storage_error(exc, path, "looking at an input file") from exc
    if not stat.S_ISREG(info.st_mode):
        kind = "FIFO" if stat.S_ISFIFO(info.st_mode) else "socket or device"
        if stat.S_ISDIR(info.st_mode):
            kind = "directory"
        raise UnsafePathError(
            f"input {path.name} is a {kind}, not a regular file",
            path=path,
            hint="Inputs are found by their suffix (.jsonl, .jsonl.gz, .parquet, ...); rename or move this entry "
            "out of --input-dir",
        )
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise storage_error(exc, path, "opening an input file") from exc
    return path


def _check_utf8_name(path: Path, root: Path) -> None:
    """Refuse an input whose name is not valid UTF-8, before anything is written.

    Why refuse rather than escape: every input's name goes into the run key, the resume
    journal and the manifest (JSON text) and into messages; an escaped spelling could
    collide with a real name in the identity that resume relies on, and a rename is a
    one-line fix.
    """
    relative = str(path.relative_to(root))
    try:
        relative.encode("utf-8")
    except UnicodeEncodeError:
        shown = relative.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        where = str(root).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise UnsafePathError(
            f"input file name '{shown}' is not valid UTF-8 (bytes shown as \\xNN)",
            path=where,
            field="input_dir",
            hint="Rename the file to a UTF-8 name (e.g. with `convmv -f latin1 -t utf8` or mv): input names are "
            "recorded in the run's journal and manifest, which are JSON text",
        ) from None


def discover_inputs(input_dir: str | os.PathLike[str], *, hash_contents: bool = False) -> list[InputFile]:
    """Every input file (by a registered reader's suffix) under ``input_dir``, recursively, sorted by path.

    Each file's magic bytes must agree with its suffix (a FormatError otherwise), checked here so that
    a mislabelled file stops the run before anything is written.
    """
    root = Path(input_dir)
    if not root.is_dir():
        raise MissingFileError(
            "input directory does not exist or is not a directory",
            path=root,
            hint=f"Pass --input-dir DIR holding input files ({_listed()})",
        )
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames:
            if name.endswith(input_suffixes()):
                found.append(_regular_input(Path(dirpath) / name))
    found.sort(key=lambda p: p.relative_to(root).as_posix())
    if not found:
        raise ConfigError(
            f"no input files ({_listed()}) under the input directory",
            path=root,
            field="input_dir",
            hint="Check --input-dir; inputs are found recursively by their suffix",
        )
    files = []
    for path in found:
        _check_utf8_name(path, root)
        info = path.stat()
        files.append(
            InputFile(
                path=path,
                relative=path.relative_to(root).as_posix(),
                size=info.st_size,
                mtime_ns=info.st_mtime_ns,
                content_hash=_hash_file(path) if hash_contents else None,
                kind=sniff(path),
            )
        )
    return files


def input_staging_dir(url: str, plan_cache_dir: str | os.PathLike[str] | None) -> Path:
    """``CACHE/inputs/<hash of URL>``: where the objects of an input prefix are staged when read."""
    from tokenloom.formats.remote.cache import default_cache_dir

    root = Path(plan_cache_dir) if plan_cache_dir is not None else default_cache_dir()
    return root / "inputs" / hashlib.sha256(url.encode()).hexdigest()[:24]


def discover_remote_inputs(url: str, remote: RemoteOptions | None, staging: Path) -> list[InputFile]:
    """Every input object (by suffix) under the prefix ``url``, sorted by relative key; nothing is fetched."""
    from tokenloom.formats.remote import helper
    from tokenloom.formats.remote.options import RemoteOptions

    parsed = parse_url(url)
    config = (remote or RemoteOptions()).store(parsed)
    listed = helper.list_objects(config)
    base = f"{parsed.prefix}/" if parsed.prefix else ""
    files = []
    for obj in listed:
        relative = obj.key[len(base) :]
        if not relative.endswith(input_suffixes()) or relative.endswith("/"):
            continue
        tag = hashlib.sha256(obj.etag.encode()).hexdigest()[:16]
        files.append(
            InputFile(
                path=staging / tag / relative,
                relative=relative,
                size=obj.size,
                mtime_ns=0,
                url=obj.url,
                etag=obj.etag,
                remote=(config, obj),
            )
        )
    if not files:
        helper.check_bucket(config)  # a missing bucket is named as such
        raise ConfigError(
            f"no input objects ({_listed()}) under the input prefix",
            path=url,
            field="input_dir",
            hint="Check --input-dir; inputs are found recursively under the prefix by their suffix",
        )
    return sorted(files, key=lambda f: f.relative)
