"""Read-only: native directories in tokenloom's pre-release ``.idx`` layout (format ``native-v0``).

Before the switch to GPT-Simple's layout the native ``.idx`` header was ``<4sHHQ`` (uint16
version, uint16 dtype code 1 uint8 / 2 uint16 / 3 uint32 / 4 int32 / 5 int64,
uint64 count) under manifest version 1; the arrays after it are the same as
GPT-Simple's. This reader exists so that such data converts in one command::

    tokenloom convert OLD_DIR NEW_DIR --to native --from native-v0

It is never chosen by detection: ``open_dataset`` on an old directory raises a
FormatError that names that command.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tokenloom.formats._contract import Validate
from tokenloom.formats._dataset import TokenDataset
from tokenloom.formats.errors import FormatError
from tokenloom.formats.io.dtypes import as_token_dtype
from tokenloom.formats.io.manifest import MANIFEST_NAME, read_manifest
from tokenloom.formats.io.output import refuse_unfinished
from tokenloom.formats.io.paths import safe_file
from tokenloom.formats.native.layout import parse_legacy_header
from tokenloom.formats.native.reader import _stems_without_manifest, read_native_shard, shards_dataset

__all__ = ["open_native_v0"]


def open_native_v0(
    path: str | os.PathLike[str], *, validate: Validate = Validate.FAST, dtype: Any = None
) -> TokenDataset:
    """Open a pre-release native directory (manifest version 1, ``<4sHHQ`` headers)."""
    root = Path(path)
    refuse_unfinished(root)
    dtype_hint = as_token_dtype(dtype) if dtype is not None else None
    manifest = None
    if (root / MANIFEST_NAME).exists():
        safe_file(root, root / MANIFEST_NAME)
        manifest = read_manifest(root)
        if manifest.format != "native" or manifest.version != 1:
            raise FormatError(
                f"manifest says format {manifest.format!r} version {manifest.version}, expected native version 1",
                path=root / MANIFEST_NAME,
                hint="Only pre-release tokenloom native data needs --from native-v0; open this one as it is",
            )
        if validate != Validate.NONE:
            manifest.verify(root, deep=validate == Validate.DEEP)
        stems = [f.name[:-4] for f in manifest.files if f.name.endswith(".idx")]
        dtype_hint = as_token_dtype(manifest.dtype, field="manifest dtype")
    else:
        stems = _stems_without_manifest(root)
    shards = []
    for stem in stems:
        shards.append(read_native_shard(root, stem, dtype_hint=dtype_hint, header=parse_legacy_header))
        dtype_hint = shards[0].dtype
    return shards_dataset(shards, "native-v0", root, manifest, validate)
