"""Modalities packed files (``.pbin``), with the allow-list pickle parser for their index.

``reader.py`` holds the byte layouts (8- and 12-byte headers), detector and reader, ``writer.py``
the writer, ``pickle_safe.py`` reads and writes the pickled index without ``pickle.loads``.
"""

from tokenloom.formats._contract import FormatSpec
from tokenloom.formats.packed.reader import is_packed, open_packed, read_packed_file
from tokenloom.formats.packed.writer import PackedWriter

__all__ = ["SPEC", "PackedWriter", "is_packed", "open_packed", "read_packed_file"]

DESCRIPTION = "Modalities .pbin packed files (current and legacy layouts)"
OPTIONS = ("layout", "eos_id", "vocab_size", "max_index_bytes", "max_entries")

SPEC = FormatSpec(
    "packed", DESCRIPTION, is_packed, open_packed, PackedWriter, OPTIONS, suffixes=(".pbin",), output_name="data.pbin"
)
