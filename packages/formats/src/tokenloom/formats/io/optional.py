"""Import an optional dependency, or say exactly which extra installs it."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["require"]


def require(module: str, *, distribution: str, extra: str, purpose: str) -> ModuleType:
    """Import ``module`` or raise ImportError naming ``pip install "distribution[extra]"``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{purpose} needs the optional dependency {module!r}, which is not installed. "
            f'Install it with: pip install "{distribution}[{extra}]"'
        ) from exc
