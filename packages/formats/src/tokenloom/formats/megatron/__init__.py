"""Megatron-LM indexed datasets (``MMIDIDX`` ``.idx`` + ``.bin``).

``reader.py`` holds the byte layout, detector and reader, ``writer.py`` the writer.
"""

from tokenloom.formats._contract import FormatSpec
from tokenloom.formats._registry import register_format
from tokenloom.formats.megatron.reader import is_megatron, open_megatron
from tokenloom.formats.megatron.writer import MegatronWriter

__all__ = ["SPEC", "MegatronWriter", "is_megatron", "open_megatron"]

SPEC = FormatSpec(
    name="megatron",
    description="Megatron-LM MMIDIDX .idx + .bin indexed datasets",
    detect=is_megatron,
    open=open_megatron,
    writer=MegatronWriter,
    options=("vocab_size", "eos_id"),
)
register_format(SPEC)
