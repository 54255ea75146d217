"""Flat shard directories: 1-D ``.npy`` or raw ``.bin`` token files (KempnerForge, tatm).

``reader.py`` holds the layout doc, detector and reader, ``writer.py`` the writer, ``npy.py`` the
``.npy`` header parser and writer, ``tatm.py`` tatm's ``metadata.json`` / ``metadata.yaml``.
"""

import re

from tokenloom.formats._contract import FormatSpec
from tokenloom.formats.flat.reader import DOCUMENT_LENGTHS_NAME, is_flat, open_flat
from tokenloom.formats.flat.writer import FILE_FORMATS, FlatWriter

__all__ = ["DOCUMENT_LENGTHS_NAME", "FILE_FORMATS", "SPEC", "FlatWriter", "is_flat", "open_flat"]

DESCRIPTION = "a directory of 1-D .npy or raw .bin token shards (KempnerForge, tatm)"
OPTIONS = ("file_pattern", "split", "eos_id", "vocab_size")
FILE_NAMES = rf"shard_\d+\.(npy|bin)|{re.escape(DOCUMENT_LENGTHS_NAME)}|manifest\.json"  # what its writer puts there

SPEC = FormatSpec(
    "flat", DESCRIPTION, is_flat, open_flat, FlatWriter, OPTIONS, suffixes=(".bin", ".npy"), file_names=FILE_NAMES
)
