"""One registry: format name -> :class:`FormatSpec` (token formats and keyed stores alike).

Each format folder defines its own spec (``native/__init__.py`` and so on), which the registry imports
the first time that format is asked for (:data:`_FOLDERS`); a third party's format registers through
the ``tokenloom.formats`` entry-point group, whose value is a :class:`FormatSpec` (or a function
returning one), loaded the first time the registry is asked.
``detect_format`` asks every detector; exactly one must say yes.
"""

from __future__ import annotations

import importlib
import logging
import os
from importlib import metadata
from pathlib import Path
from typing import Any

from tokenloom.formats._contract import FormatSpec, Validate, as_validate
from tokenloom.formats._dataset import TokenDataset
from tokenloom.formats._writer import TokenWriter
from tokenloom.formats.errors import ConfigError, DataError, FormatError, MissingFileError
from tokenloom.formats.io.output import refuse_unfinished
from tokenloom.formats.io.paths import as_path
from tokenloom.formats.io.progress import ProgressCallback, reporting
from tokenloom.formats.io.safety import unlisted_files
from tokenloom.formats.io.source import add_data_suffixes, before_data_suffixes
from tokenloom.formats.io.storage import check_readable, storage_errors
from tokenloom.formats.io.urls import StoredPath, is_remote_url, refuse_remote_output

_log = logging.getLogger("tokenloom.formats")

__all__ = [
    "ENTRY_POINT_GROUP",
    "available_formats",
    "detect_format",
    "open_dataset",
    "open_writer",
    "register_format",
    "writable_formats",
    "writer_spec",
]

#: Third-party formats: ``[project.entry-points."tokenloom.formats"] name = "pkg.module:SPEC"``.
ENTRY_POINT_GROUP = "tokenloom.formats"

_FORMATS: dict[str, FormatSpec] = {}
#: The folders of the built-in formats, imported in this order when a format is first asked for (a plain
#: native run needs neither the keyed stores nor the other readers); a name registered before stays as registered.
_FOLDERS = ("native", "flat", "megatron", "packed", "keyed")
_plugins_loaded = False
#: Formats registered from entry points: name -> "'entry' (module:attr)", to name a plugin in an error.
_PLUGIN_ORIGINS: dict[str, str] = {}


def register_format(spec: FormatSpec) -> None:
    """Add (or replace) a format under ``spec.name``."""
    if not isinstance(spec, FormatSpec):
        raise ConfigError(f"register_format takes a FormatSpec, got {type(spec).__name__}", field="spec")
    _FORMATS[spec.name] = spec
    add_data_suffixes(spec.suffixes)


def _import_folders(name: str | None = None) -> None:
    """Register the specs of the built-in format folders (every FormatSpec a folder's ``__init__`` defines), one
    folder after the other until ``name`` is registered (None: all of them)."""
    for folder in _FOLDERS:
        if name is not None and name in _FORMATS:
            return
        module = importlib.import_module(f"tokenloom.formats.{folder}")
        for spec in [value for value in vars(module).values() if isinstance(value, FormatSpec)]:
            if spec.name not in _FORMATS:
                register_format(spec)


before_data_suffixes(_import_folders)  # a remote listing reads every format's data files by blocks


def _registered(name: str) -> FormatSpec | None:
    """The spec registered as ``name`` (a built-in one, else a plugin's), or None."""
    _import_folders(name)
    if name not in _FORMATS:
        _load_plugins()
    return _FORMATS.get(name)


def _load_plugins() -> None:
    """Register every format of the ``tokenloom.formats`` entry-point group (once per process).

    All or nothing: a plugin that fails to load, is not a FormatSpec or takes a name already
    registered (a built-in format, or another plugin's) is a ConfigError, raised again on every
    ask rather than leaving a registry that silently lacks the plugin or lost a built-in.
    """
    global _plugins_loaded
    if _plugins_loaded:
        return
    _import_folders()  # a plugin must not take a built-in format's name
    found: dict[str, tuple[FormatSpec, str]] = {}
    for point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        where = f"format plugin {point.name!r} ({point.value})"
        try:
            loaded = point.load()
            spec = loaded() if callable(loaded) else loaded
        except Exception as exc:
            raise ConfigError(
                f"{where} failed to load: {type(exc).__name__}: {exc}",
                field="format",
                hint=f"Reinstall or uninstall the package that declares it in the {ENTRY_POINT_GROUP!r} entry points",
            ) from exc
        if not isinstance(spec, FormatSpec):
            raise ConfigError(
                f"{where} gave a {type(spec).__name__}, expected a FormatSpec",
                field="format",
                hint="The entry point must name a FormatSpec or a function that returns one",
            )
        if spec.name in _FORMATS or spec.name in found:
            other = (
                f"plugin {found[spec.name][1]}"
                if spec.name in found
                else "a format built in or registered by register_format"
            )
            raise ConfigError(
                f"{where} registers {spec.name!r}, the name of {other}",
                field="format",
                hint="Give the plugin's FormatSpec a name of its own; tokenloom does not let a plugin replace a format",
            )
        found[spec.name] = (spec, f"{point.name!r} ({point.value})")
    for spec, origin in found.values():
        register_format(spec)
        _PLUGIN_ORIGINS[spec.name] = origin
    _plugins_loaded = True


def available_formats() -> dict[str, FormatSpec]:
    """Registered formats by name (built in, then entry-point plugins)."""
    _import_folders()
    _load_plugins()
    return dict(_FORMATS)


def _spec(name: str) -> FormatSpec:
    spec = _registered(name)
    if spec is None:
        raise ConfigError(f"unknown format {name!r}, expected one of {sorted(available_formats())}", field="format")
    return spec


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
    if is_remote_url(path):  # credentials from the environment; open_dataset(URL, remote=...) detects too
        from tokenloom.formats.remote.opener import detect_remote

        return detect_remote(path, formats=_format_table())
    target = as_path(path)
    if not target.exists() and not any(target.parent.glob(target.name + ".*")):
        raise MissingFileError(f"{target} does not exist", path=target, hint=_nearest_hint(target))
    refuse_unfinished(target)
    detectable = {name: spec for name, spec in available_formats().items() if spec.detectable}
    matches = [name for name, spec in detectable.items() if _detects(name, spec, target)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        # a detector cannot read what it cannot open: an unreadable manifest or shard is the real cause
        if not isinstance(target, StoredPath):  # an object-store listing: read through the cache when opened
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


def _detects(name: str, spec: FormatSpec, target: Path) -> bool:
    """``spec.detect(target)``; a plugin's detector that raises is named (it would otherwise read as a
    fault of the user's data, and make every dataset undetectable)."""
    origin = _PLUGIN_ORIGINS.get(name)
    if origin is None or _FORMATS.get(name) is not spec:
        return spec.detect(target)
    try:
        return bool(spec.detect(target))
    except DataError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"the detector of format plugin {origin} raised {type(exc).__name__} on {target}: {exc}",
            field="format",
            hint="Pass format=NAME (--format NAME) to skip detection, and fix or uninstall the plugin",
        ) from exc


def _datasets_inside(target: Path, detectable: dict[str, FormatSpec]) -> list[str]:
    """Names of the subdirectories of ``target`` that a reader recognises (a bucket root, say)."""
    if not target.is_dir():
        return []
    found = []
    for child in sorted(p for p in target.iterdir() if p.is_dir() and not p.name.startswith(".")):
        try:
            if any(_detects(name, spec, child) for name, spec in detectable.items()):
                found.append(child.name)
        except OSError:
            continue
    return found


def open_dataset(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    dtype: Any = None,
    validate: Validate | str = Validate.FAST,
    on_progress: ProgressCallback | None = None,
    **options: Any,
) -> TokenDataset:
    """Open any token dataset tokenloom reads; see :class:`Validate` for ``validate``.

    ``on_progress(stage, done, total)`` follows the long reads of deep validation (checksums in
    bytes, token ids in tokens, EOS placement in entries): see :mod:`tokenloom.formats.io.progress`.
    A URL (``s3://``, ``gs://``, ``az://``, ``https://``) is read through :mod:`tokenloom.formats.remote`
    with ``remote=`` (a :class:`RemoteOptions`: endpoint, credentials, ``block_cache_dir``, ``cache_limit``, ...).
    """
    if is_remote_url(path):
        from tokenloom.formats.remote import open_remote

        with reporting(on_progress):
            return open_remote(path, format=format, dtype=dtype, validate=validate, formats=_format_table(), **options)
    level = as_validate(validate)
    if "remote" in options and options["remote"] is None:
        del options["remote"]  # remote=None: a local path (a value for either kind of path, as callers pass it on)
    with storage_errors(path, "opening the dataset"), reporting(on_progress):
        spec = _spec(format or detect_format(path))
        _check_options(spec, options)
        dataset = spec.open(Path(path), validate=level, dtype=dtype, **options)
    for warning in unlisted_files(dataset):
        _log.warning("%s: %s", dataset.root, warning)
    return dataset


def _format_table() -> Any:
    """The registry's lookups for the remote opener (which runs the same readers over the listing)."""
    from tokenloom.formats.remote.opener import FormatTable

    return FormatTable(spec=_spec, detect=detect_format, check_options=_check_options, available=available_formats)


def _check_options(spec: FormatSpec, options: dict[str, Any]) -> None:
    """ConfigError for options the reader of ``spec`` does not take (e.g. vocab_size for native)."""
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        raise ConfigError(
            f"option(s) {', '.join(unknown)} do not apply to format {spec.name!r}",
            field=unknown[0],
            hint=f"The data was detected as {spec.name}; drop the option or pass the intended format",
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
    refuse_remote_output(path)
    writer = writer_spec(format).writer
    with storage_errors(path, f"creating the {format} output"):
        return writer(path, dtype=dtype, vocab_size=vocab_size, eos_id=eos_id, **options)  # pyright: ignore[reportOptionalCall]


def writable_formats(*, keyed: bool = True) -> list[str]:
    """The registered formats that have a writer, sorted: what ``convert --to`` takes.

    ``keyed=False`` leaves out the keyed stores (formats with a store side): what ``tokenize --format``
    writes documents into.
    """
    return sorted(
        name for name, spec in available_formats().items() if spec.writer is not None and (keyed or spec.store is None)
    )


def writer_spec(format: str, *, field: str = "format") -> FormatSpec:
    """The spec of ``format`` if it has a writer; ConfigError listing the writable formats otherwise."""
    spec = _registered(format)
    if spec is None or spec.writer is None:
        raise ConfigError(f"cannot write format {format!r}, writable: {writable_formats()}", field=field)
    return spec
