"""How document boundaries inside a window are treated (``pack_sequences``): numpy-free, torch-free."""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from tokenloom.formats import ConfigError

__all__ = ["Packing", "as_packing", "check_choice"]

_Choice = TypeVar("_Choice", bound=StrEnum)


def check_choice(choices: type[_Choice], value: object, field: str, label: str | None = None) -> _Choice:
    """``value`` as a member of ``choices``, or a ConfigError (``label``, default ``field``) listing every value."""
    try:
        return choices(value)
    except ValueError:
        valid = [member.value for member in choices]
        raise ConfigError(f"{label or field} {value!r}, expected one of {valid}", field=field) from None


class Packing(StrEnum):
    """How document boundaries inside a window are treated."""

    NONE = "none"
    """Plain language modelling: every label kept, no document keys."""
    DOCUMENTS = "documents"
    """KempnerForge: doc_ids from EOS, labels -100 where input and label token belong to different documents."""
    GPT_SIMPLE = "gpt-simple"
    """GPT-Simple: positions continuous (0..L-1), the token after each EOD masked as a label."""


def as_packing(value: bool | str | Packing) -> Packing:
    """``True`` means ``Packing.DOCUMENTS``, ``False`` means ``Packing.NONE``."""
    if value is True:
        return Packing.DOCUMENTS
    if value is False:
        return Packing.NONE
    try:
        return Packing(value)
    except ValueError:
        raise ConfigError(
            f"pack_sequences={value!r}, expected True, False or one of {[p.value for p in Packing]}",
            field="pack_sequences",
        ) from None
