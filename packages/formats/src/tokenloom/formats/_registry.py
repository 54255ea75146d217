"""Name -> format registry: detection, opening and writing by format name.

Each format module registers a :class:`FormatSpec` when imported (see
``__init__``). ``detect_format`` asks every detector; exactly one must say yes.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from tokenloom.formats._atomic import WRITING_MARKER
from tokenloom.formats._dataset import TokenDataset
from tokenloom.formats._progress import ProgressCallback, reporting
from tokenloom.formats._safety import unlisted_files
from tokenloom.formats._storage import check_readable, storage_errors
from tokenloom.formats._writer import TokenWriter
from tokenloom.formats.errors import ConfigError, FormatError, MissingFileError

_log = logging.getLogger("tokenloom.formats")

__all__ = [
    "FormatSpec",
    "Validate",
    "available_formats",
    "detect_format",
    "open_dataset",
    "open_writer",
    "register_format",
]


class Validate(StrEnum):
    """How much ``open_dataset`` checks before returning."""

    NONE = "none"  # trust the files (sizes are still read)
    FAST = "fast"  # headers, sizes, offsets, manifest (and index-file checksums)
    DEEP = "deep"  # also every checksum, token ids < vocab size, EOS placement


@dataclass(frozen=True, slots=True)
class FormatSpec:
    """A token format tokenloom can read (and usually write)."""

    name: str
    description: str
    detect: Callable[[Path], bool]
    open: Callable[..., TokenDataset]  # open(path, *, validate, dtype, **options)
    writer: Callable[..., TokenWriter] | None = None  # writer(path, *, dtype, vocab_size, eos_id, **options)
    detectable: bool = True  # False: opened only by name (format=...), never chosen by detect_format


_FORMATS: dict[str, FormatSpec] = {}


def register_format(spec: FormatSpec) -> None:
    """Add (or replace) a format under ``spec.name``."""
    _FORMATS[spec.name] = spec


def available_formats() -> dict[str, FormatSpec]:
    """Registered formats by name."""
    return dict(_FORMATS)


def _spec(name: str) -> FormatSpec:
    try:
        return _FORMATS[name]
    except KeyError:
        raise ConfigError(f"unknown format {name!r}, expected one of {sorted(_FORMATS)}", field="format") from None


def _nearest_hint(target: Path) -> str:
    """What to check for a path that does not exist: its nearest existing parent, and what that holds."""
    parent = target.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    try:
        names = sorted(p.name for p in parent.iterdir())[:6]
    except OSError:
        names = []
    shown = f" (it holds {', '.join(names[:5])}{', ...' if len(names) > 5 else ''})" if names else " (it is empty)"
    return f"Check the path for a typo: the nearest existing directory is {parent}{shown}"


def _found(target: Path) -> str:
    """A short account of what is at ``target`` (for the 'no reader recognises' message)."""
    if target.is_file():
        return f"it is a {target.stat().st_size}-byte file with suffix {target.suffix or '(none)'!r}"
    try:
        names = sorted(p.name for p in target.iterdir())
    except OSError:
        return "it cannot be listed"
    if not names:
        return "the directory is empty"
    return f"the directory holds {', '.join(names[:5])}{f' and {len(names) - 5} more' if len(names) > 5 else ''}"


def detect_format(path: str | os.PathLike[str]) -> str:
    """The one registered format that recognises ``path``, or FormatError listing what was tried."""
    target = Path(path)
    if not target.exists() and not any(target.parent.glob(target.name + ".*")):
        raise MissingFileError(f"{target} does not exist", path=target, hint=_nearest_hint(target))
    if (target / WRITING_MARKER).exists():
        raise FormatError(
            f"{WRITING_MARKER} is present: a writer did not finish (killed or still running)",
            path=target,
            hint="Wait for the writer, or rerun the command that writes this dataset",
        )
    detectable = {name: spec for name, spec in _FORMATS.items() if spec.detectable}
    matches = [name for name, spec in detectable.items() if spec.detect(target)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        # a detector cannot read what it cannot open: an unreadable manifest or shard is the real cause
        check_readable(p for p in ([target] if target.is_file() else sorted(target.glob("*"))) if p.is_file())
        inner = _datasets_inside(target, detectable)
        if inner:
            shown = ", ".join(inner[:5]) + (f" and {len(inner) - 5} more" if len(inner) > 5 else "")
            raise FormatError(
                f"this directory is not one dataset: it holds {len(inner)} dataset directories ({shown})",
                path=target,
                hint=f"Open one of them ({target / inner[0]}); for buckets (train/<bucket>, val/<bucket>) "
                "tokenloom.formats.open_buckets(ROOT) opens them all",
            )
        raise FormatError(
            f"no reader recognises this layout (tried {', '.join(sorted(detectable))}); {_found(target)}",
            path=target,
            hint="Point at the dataset directory, a Megatron prefix or a .pbin file; if the format is known "
            "but not detected, pass format=NAME (--format NAME)",
        )
    raise FormatError(
        f"the layout is ambiguous: it could be {' or '.join(sorted(matches))}",
        path=target,
        hint="Pass format=... (--format) to choose",
    )


def _datasets_inside(target: Path, detectable: dict[str, FormatSpec]) -> list[str]:
    """Names of the subdirectories of ``target`` that a reader recognises (a bucket root, say)."""
    if not target.is_dir():
        return []
    found = []
    for child in sorted(p for p in target.iterdir() if p.is_dir() and not p.name.startswith(".")):
        try:
            if any(spec.detect(child) for spec in detectable.values()):
                found.append(child.name)
        except OSError:
            continue
    return found


def open_dataset(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    dtype: Any = None,
    validate: str = "fast",
    on_progress: ProgressCallback | None = None,
    **options: Any,
) -> TokenDataset:
    """Open any token dataset tokenloom reads; see :class:`Validate` for ``validate``.

    ``on_progress(stage, done, total)`` follows the long reads of deep validation (checksums in
    bytes, token ids in tokens, EOS placement in entries): see :mod:`tokenloom.formats._progress`.
    """
    try:
        level = Validate(validate)
    except ValueError:
        raise ConfigError(
            f"validate={validate!r}, expected one of {[v.value for v in Validate]}", field="validate"
        ) from None
    with storage_errors(path, "opening the dataset"), reporting(on_progress):
        name = format or detect_format(path)
        _check_options(name, options)
        dataset = _spec(name).open(Path(path), validate=level.value, dtype=dtype, **options)
    for warning in unlisted_files(dataset):
        _log.warning("%s: %s", dataset.root, warning)
    return dataset


def _check_options(name: str, options: dict[str, Any]) -> None:
    """ConfigError for options the reader of ``name`` does not take (e.g. vocab_size for native)."""
    try:
        accepted = inspect.signature(_spec(name).open).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        return
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ConfigError(
            f"option(s) {', '.join(unknown)} do not apply to format {name!r}",
            field=unknown[0],
            hint=f"The data was detected as {name}; drop the option or pass the intended format",
        )


def open_writer(
    path: str | os.PathLike[str],
    *,
    format: str = "native",
    dtype: Any,
    vocab_size: int | None = None,
    eos_id: int | None = None,
    **options: Any,
) -> TokenWriter:
    """A crash-safe writer for ``format``: use as a context manager, ``add`` entries."""
    spec = _spec(format)
    if spec.writer is None:
        writable = sorted(name for name, s in _FORMATS.items() if s.writer is not None)
        raise ConfigError(f"format {format!r} is read-only here, writable: {writable}", field="format")
    with storage_errors(path, f"creating the {format} output"):
        return spec.writer(path, dtype=dtype, vocab_size=vocab_size, eos_id=eos_id, **options)
