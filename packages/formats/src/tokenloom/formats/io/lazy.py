"""Lazy package exports: a package ``__init__`` names what it exports and imports each on first use.

Why: ``tokenloom curriculum status --help`` must not import torch because the package it lives in
exports a torch Dataset. Every tokenloom package ``__init__`` declares ``_EXPORTS`` (name -> module)
and takes its module ``__getattr__`` / ``__dir__`` from :func:`lazy_exports`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    module: str, exports: Mapping[str, str], namespace: MutableMapping[str, Any], names: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``module``: ``exports`` maps a public name to the module defining it (a
    name that maps to ``module.name`` is that subpackage itself)."""

    def __getattr__(name: str) -> Any:
        source = exports.get(name)
        if source is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        imported = importlib.import_module(source)
        value = imported if source == f"{module}.{name}" else getattr(imported, name)  # a subpackage itself
        namespace[name] = value  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return __getattr__, __dir__
