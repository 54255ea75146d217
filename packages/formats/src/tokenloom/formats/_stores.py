"""Keyed stores by name ("h5", "bin"): a view of the one format registry, and ``open_store``.

Beside the registry, not in ``keyed/``: the registry imports the format folders, so a folder must not ask it.

A store is the keyed side of a registered format (``FormatSpec.store``); nothing here keeps a table of
its own, so a third party's format with a store side opens like the built-in ones.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from tokenloom.formats._contract import StoreSpec
from tokenloom.formats._registry import available_formats
from tokenloom.formats.errors import ConfigError, FormatError, MissingFileError
from tokenloom.formats.io.paths import as_path
from tokenloom.formats.keyed.store import KeyedStore, read_store

if TYPE_CHECKING:
    from tokenloom.formats.remote.options import RemoteOptions

__all__ = ["StoreFactory", "detect_store_type", "open_store", "store_spec"]


def _stores() -> dict[str, StoreSpec]:
    """Keyed stores by storage type ("h5", "bin"): the registered formats that have a store side."""
    return {spec.store.name: spec.store for spec in available_formats().values() if spec.store is not None}


def store_spec(format: str) -> StoreSpec:
    """The keyed store registered as ``format`` (a store name, "h5" / "bin", or its token format's name,
    "bin-meta"); ConfigError listing the valid names otherwise."""
    stores = _stores()
    if format not in stores:
        spec = available_formats().get(format)
        if spec is not None and spec.store is not None:
            return spec.store
        raise ConfigError(f"unknown storage type {format!r}, expected one of {sorted(stores)}", field="format")
    return stores[format]


def detect_store_type(path: str | os.PathLike[str]) -> str:
    """The storage type of the keyed store at ``path`` (``"h5"``: .h5/.hdf5 files, ``"bin"``: meta.json)."""
    target = as_path(path)  # an object-store path (open_store of a URL) stays one
    stores = _stores()
    if not target.exists():
        raise MissingFileError(f"{target.name} does not exist", path=target)
    found = [name for name, store in stores.items() if store.detect(target)]
    if len(found) == 1:
        return found[0]
    if target.is_file() and not found:
        raise FormatError(f"{target.name} is not a keyed store (expected .h5/.hdf5 or a directory)", path=target)
    if not found:
        tried = ", ".join(f"{name}: {store.looks_like}" for name, store in stores.items())
        raise FormatError(f"no keyed store here (tried {tried})", path=target, field="format")
    raise FormatError(
        f"the directory holds more than one kind of keyed store ({', '.join(found)})",
        path=target,
        hint=f"Pass format={found[0]!r} or another of {found}",
    )


def open_store(
    path: str | os.PathLike[str],
    format: str | None = None,
    *,
    train_type: str | None = None,
    remote: RemoteOptions | None = None,
    **options: Any,
) -> KeyedStore:
    """Load the keyed store at ``path`` (backend detected unless ``format`` is given: "h5" or "bin").

    ``train_type`` (seq / sft / dpo / grpo) checks that its keys are present;
    ``options`` go to the store (``validate``, ``max_elements``).
    ``path`` may be a URL (``s3://``, ``gs://``, ``az://``, ``https://``): the store is then read through the
    remote layer (:func:`tokenloom.formats.remote.opener.read_remote`: the listing, the node's block cache, the
    manifest's hashes) with ``remote`` (a RemoteOptions; None: the environment's settings). The store keeps
    ``remote`` as ``store.remote`` and its URL as ``store.path``; it pickles with its block cache's settings, so
    a DataLoader worker reads the same objects the same way. ``remote`` for a local path is a ConfigError.
    """
    return read_store(path, remote, lambda root: _load(root, format, train_type, options))


def _load(path: str | os.PathLike[str], format: str | None, train_type: str | None, options: dict) -> KeyedStore:
    """The keyed store at a local path, or at the :class:`RemotePath` :func:`read_store` hands in."""
    store = store_spec(format or detect_store_type(path)).store(**options)
    store.load(path)
    if train_type is not None:
        store.require(train_type)
    return store


class StoreFactory:
    """Keyed stores by format (``"h5"``, ``"bin"``): a view of the one format registry."""

    @classmethod
    def names(cls) -> list[str]:
        return sorted(_stores())

    @classmethod
    def create(cls, name: str, **options: Any) -> KeyedStore:
        """An unloaded store of type ``name``; ConfigError listing the valid names otherwise."""
        return store_spec(name).store(**options)
