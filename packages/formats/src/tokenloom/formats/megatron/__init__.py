"""Megatron-LM indexed datasets (``MMIDIDX`` ``.idx`` + ``.bin``).

``reader.py`` holds the byte layout, detector and reader, ``writer.py`` the writer.
"""

from tokenloom.formats._contract import FormatSpec
from tokenloom.formats.megatron.reader import CODE_OF_DTYPE, is_megatron, open_megatron
from tokenloom.formats.megatron.writer import MegatronWriter, megatron_targets

__all__ = ["SPEC", "MegatronWriter", "is_megatron", "open_megatron"]

DESCRIPTION = "Megatron-LM MMIDIDX .idx + .bin indexed datasets"
OPTIONS = ("vocab_size", "eos_id")

SPEC = FormatSpec(
    "megatron",
    DESCRIPTION,
    detect=is_megatron,
    open=open_megatron,
    writer=MegatronWriter,
    options=OPTIONS,
    suffixes=(".bin",),
    targets=megatron_targets,
    output_name="data",  # data.bin + data.idx inside an output directory
    dtypes=tuple(CODE_OF_DTYPE),
)
