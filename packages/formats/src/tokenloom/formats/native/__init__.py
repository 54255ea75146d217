"""The native format: GPT-Simple ``.bin`` + ``.idx`` shards with tokenloom's ``manifest.json``.

``layout.py`` holds the byte layout (header, offsets, overlap prefixes) and its parser,
``reader.py`` the detector, ``open_native`` and ``open_native_v0`` (the read-only pre-release layout),
``writer.py`` the writers and ``adopt_native`` (its docstring: the dataset layout).
"""

from tokenloom.formats._contract import FormatSpec
from tokenloom.formats.native.reader import is_native, open_native, open_native_v0, read_native_shard
from tokenloom.formats.native.writer import NativeShardWriter, NativeWriter, adopt_native

__all__ = [
    "SPEC",
    "SPEC_V0",
    "NativeShardWriter",
    "NativeWriter",
    "adopt_native",
    "is_native",
    "open_native",
    "open_native_v0",
    "read_native_shard",
]

DESCRIPTION = "GPT-Simple .bin + .idx shards (tokenloom adds manifest.json; GPT-Simple's own open without)"
FILE_NAMES = r"shard_\d+\.(bin|idx)|manifest\.json"  # what its writer puts in its directory
DESCRIPTION_V0 = "read-only: tokenloom's pre-release native layout, to convert (never detected)"


SPEC = FormatSpec(
    "native",
    DESCRIPTION,
    is_native,
    open_native,
    NativeWriter,
    suffixes=(".bin",),
    file_names=FILE_NAMES,
    manifest_required=True,
    unit_shards=True,
)
SPEC_V0 = FormatSpec("native-v0", DESCRIPTION_V0, detect=lambda path: False, open=open_native_v0, detectable=False)
