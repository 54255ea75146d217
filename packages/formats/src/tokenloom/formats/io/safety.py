"""What ``--overwrite`` may delete, and outputs that would destroy their own inputs.

Two rules, checked before anything is deleted:

- ``check_replaceable(dir)``: a directory may be cleared only if it is empty or is
  recognisably tokenloom output (a tokenloom ``manifest.json``, the writing marker,
  a keyed ``meta.json`` store, or only files the caller calls its own). Anything
  else is a ConfigError naming the files it would have deleted.
- ``check_disjoint(targets, inputs)``: after resolving real paths (symlinks
  included), no target may be, contain or lie inside one of the inputs.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import orjson

from tokenloom.formats.errors import ConfigError
from tokenloom.formats.io.atomic import TMP_SUFFIX, WRITING_MARKER, temp_base
from tokenloom.formats.io.manifest import MANIFEST_NAME

__all__ = [
    "check_disjoint",
    "check_replaceable",
    "dataset_inputs",
    "foreign_files",
    "real_path",
    "remove_on_failure",
    "unlisted_files",
]

SHOW_NAMES = 5
_GENERIC_OURS = re.compile(r"shard_\d+\.(bin|idx|npy)|document_lengths\.i64|metadata\.yaml")


def real_path(path: str | os.PathLike[str]) -> Path:
    """``path`` made absolute with every symlink resolved (the missing tail kept as given)."""
    return Path(os.path.realpath(os.fspath(path)))


def _is_tokenloom_manifest(path: Path) -> bool:
    try:
        payload = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return False
    return isinstance(payload, dict) and "manifest_version" in payload


def is_tokenloom_output(directory: Path) -> bool:
    """Whether ``directory`` holds tokenloom output (finished, unfinished or damaged)."""
    if (directory / WRITING_MARKER).exists() or _is_tokenloom_manifest(directory / MANIFEST_NAME):
        return True
    meta = directory / "meta.json"  # a bin-meta keyed store: meta.json + <key>.bin
    if meta.is_file():
        others = [p.name for p in directory.iterdir() if p.name != "meta.json"]
        return all(name.endswith((".bin", TMP_SUFFIX)) for name in others)
    return False


def foreign_files(directory: Path, ours: Callable[[str], bool] | None = None) -> list[str]:
    """Names in ``directory`` that are not tokenloom's (empty when it may be cleared)."""
    names = sorted(p.name for p in directory.iterdir())
    if not names or is_tokenloom_output(directory):
        return []

    def mine(name: str) -> bool:
        base = temp_base(name)
        return (
            name == WRITING_MARKER
            or name.endswith(".tokenloom-lock")
            or _GENERIC_OURS.fullmatch(base) is not None
            or (ours is not None and (ours(name) or ours(base)))
        )

    return [name for name in names if not mine(name)]


def check_replaceable(directory: Path, ours: Callable[[str], bool] | None = None) -> None:
    """ConfigError naming the files if ``directory`` is not empty and not tokenloom output."""
    if not directory.is_dir():
        return
    foreign = foreign_files(directory, ours)
    if foreign:
        shown = ", ".join(foreign[:SHOW_NAMES]) + (f" and {len(foreign) - SHOW_NAMES} more" if len(foreign) > 5 else "")
        raise ConfigError(
            f"refusing to overwrite a directory that is not a tokenloom dataset: it holds {shown}",
            path=directory,
            hint="--overwrite only replaces tokenloom output or an empty directory; "
            "choose another output directory or move these files away",
        )


def check_disjoint(
    targets: Iterable[str | os.PathLike[str]],
    inputs: Iterable[str | os.PathLike[str]],
    *,
    target_name: str = "the output",
) -> None:
    """ConfigError if a target is, contains or lies inside an input (real paths, symlinks resolved)."""
    real_inputs = [(Path(i), real_path(i)) for i in inputs]
    for target in targets:
        real_target = real_path(target)
        for given, real_input in real_inputs:
            if real_target == real_input:
                relation = "is"
            elif real_target in real_input.parents:
                relation = "contains"
            elif real_input in real_target.parents:
                relation = "lies inside"
            else:
                continue
            raise ConfigError(
                f"{target_name} {target} {relation} the source {given} (real paths {real_target} and {real_input})",
                path=target,
                hint="Writing there would delete or change the data being read; choose a separate output path",
            )


def dataset_inputs(
    dataset: object, given: str | os.PathLike[str] | None = None, *, owns_root: bool = True
) -> list[Path]:
    """The files (and directory) a TokenDataset reads: its shard files, index siblings and root.

    ``owns_root`` False: the root is a directory the dataset shares with others (Megatron prefixes, .pbin
    files: ``FormatSpec.owns_directory``), so writing elsewhere in it is no overlap.
    """
    paths: list[Path] = []
    if given is not None:
        paths.append(Path(given))
    for shard in getattr(dataset, "shards", ()):
        tokens_path = Path(shard.tokens_path)
        paths.append(tokens_path)
        if tokens_path.suffix == ".bin":
            paths.append(tokens_path.with_suffix(".idx"))
    root = getattr(dataset, "root", None)
    if owns_root and root is not None and Path(root).is_dir():
        paths.append(Path(root))
    return paths


@contextlib.contextmanager
def remove_on_failure(created: Iterable[Path]) -> Iterator[None]:
    """On an exception, remove the paths this operation created (a directory only if it holds only our files)."""
    paths = list(created)
    try:
        yield
    except BaseException:
        for path in paths:
            with contextlib.suppress(OSError):
                if path.is_dir() and not path.is_symlink():
                    if foreign_files(path) or any(p.is_dir() for p in path.iterdir()):
                        continue
                    for entry in path.iterdir():
                        entry.unlink()
                    path.rmdir()
                elif path.is_file():
                    path.unlink()
        raise


_DATA_SUFFIXES = (".bin", ".idx", ".npy")


def unlisted_files(dataset: object) -> list[str]:
    """Data-looking files in a manifest directory that its manifest does not list (readers ignore them)."""
    root = getattr(dataset, "root", None)
    if root is None or not Path(root).is_dir() or not (Path(root) / MANIFEST_NAME).is_file():
        return []
    try:
        payload = orjson.loads((Path(root) / MANIFEST_NAME).read_bytes())
        listed = {entry["name"] for entry in payload.get("files", ())}
    except (OSError, orjson.JSONDecodeError, TypeError, KeyError, AttributeError):
        return []
    names = sorted(name for name in os.listdir(root) if name.endswith(_DATA_SUFFIXES) and name not in listed)
    return [
        f"{name} is not listed in {MANIFEST_NAME} and is not read (a copy left over? remove it or re-create "
        "the dataset)"
        for name in names
    ]
