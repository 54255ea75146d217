"""Old names kept for one release: keywords, attributes and module constants that were renamed.

tokenloom says ``train_type``, ``format``, ``path`` and ``seq_len`` everywhere; the names they replaced
(``training_type``, ``storage_type``, ``load_path``, ``window_size``) still work for one release with a
DeprecationWarning that names the new one. Passing an old name together with its new one is a ConfigError.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from tokenloom.formats.errors import ConfigError

__all__ = ["deprecated_property", "module_aliases", "renamed_keyword"]

T = TypeVar("T")


def _warn(message: str, stacklevel: int) -> None:
    warnings.warn(f"{message} (the old name works for one release)", DeprecationWarning, stacklevel=stacklevel + 1)


def renamed_keyword(
    owner: str, new: str, new_value: T | None, old: str, old_value: T | None, *, warn: bool = True, stacklevel: int = 3
) -> T | None:
    """The value of keyword ``new``, taken from its old name ``old`` when only that one was given.

    ``None`` means "not given". ``warn=False`` accepts the old name silently (AstrAI's names in
    ``DatasetFactory.load``, the seed's API users port from). ``stacklevel`` 3 points the warning at the
    caller of the function that calls this.
    """
    if old_value is None:
        return new_value
    if new_value is not None:
        raise ConfigError(
            f"{owner} got both {new}= and {old}= (the old name of {new})", field=new, hint=f"Pass only {new}="
        )
    if warn:
        _warn(f"{owner}: {old}= is deprecated, use {new}=", stacklevel)
    return old_value


def deprecated_property(old: str, new: str) -> property:
    """A read-only attribute ``old`` that warns and returns attribute ``new``."""

    def getter(self: Any) -> Any:
        _warn(f"{type(self).__name__}.{old} is deprecated, use .{new}", 2)
        return getattr(self, new)

    return property(getter, doc=f"Deprecated: use ``{new}``.")


def module_aliases(module: str, aliases: Mapping[str, str], namespace: Mapping[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that serves each old name in ``aliases`` (old -> new) with a warning."""

    def __getattr__(name: str) -> Any:
        if name in aliases:
            _warn(f"{module}.{name} is deprecated, use {module}.{aliases[name]}", 2)
            return namespace[aliases[name]]
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
