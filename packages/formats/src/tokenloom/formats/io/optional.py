"""Import an optional dependency, or say exactly which extra installs it."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["require"]


def require(module: str, *, distribution: str, extra: str, purpose: str) -> ModuleType:
    """Import ``module`` or raise ImportError naming ``pip install "distribution[extra]"`` and the checkout way."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{purpose} needs the optional dependency {module!r}, which is not installed. "
            f'Install it with: pip install "{distribution}[{extra}]"; from a checkout of tokenloom (the packages '
            f'are not on a registry yet): uv pip install -e "{checkout_path(distribution)}[{extra}]", or '
            "uv sync --all-packages --all-extras for everything"
        ) from exc


def checkout_path(distribution: str) -> str:
    """Where ``distribution`` lives in a checkout of the workspace: ``packages/<name>`` (the root for ``tokenloom``)."""
    name = distribution.removeprefix("tokenloom-")
    return "." if name == distribution else f"packages/{name}"
